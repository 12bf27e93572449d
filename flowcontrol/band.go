package flowcontrol

import (
	"fmt"
	"strings"
)

// Band is a priority band. Bands are strictly ordered: a queued request in a higher band is always dispatched before
// any queued request in a lower band. The zero value is Critical, the highest band.
type Band uint8

const (
	// Critical is the highest band: interactive, latency-sensitive traffic.
	Critical Band = iota
	// Standard is the default band for requests without a priority.
	Standard
	// Sheddable is the lowest band: best-effort traffic that is the first to be held back and shed.
	Sheddable
)

// NumBands is the number of bands. Arrays indexed by Band have this length.
const NumBands = 3

// allBands lists all bands from highest to lowest priority.
var allBands = [NumBands]Band{Critical, Standard, Sheddable}

// AllBands returns all bands from highest to lowest priority.
func AllBands() [NumBands]Band { return allBands }

var bandNames = [NumBands]string{"Critical", "Standard", "Sheddable"}

// String returns the band's name ("Critical", "Standard", "Sheddable"). It is also its metric label value.
func (b Band) String() string {
	if b.Valid() {
		return bandNames[b]
	}
	return fmt.Sprintf("Band(%d)", uint8(b))
}

// Valid reports whether b is one of the defined bands.
func (b Band) Valid() bool { return b < NumBands }

// higherThan reports whether b has a strictly higher priority than o.
func (b Band) higherThan(o Band) bool { return b < o }

// ParseBand parses a band name, case-insensitively.
func ParseBand(s string) (Band, error) {
	for i, name := range bandNames {
		if strings.EqualFold(s, name) {
			return Band(i), nil
		}
	}
	return 0, fmt.Errorf("unknown band %q (want one of %s)", s, strings.Join(bandNames[:], ", "))
}

// MarshalText implements encoding.TextMarshaler so bands appear by name in JSON.
func (b Band) MarshalText() ([]byte, error) {
	if !b.Valid() {
		return nil, fmt.Errorf("invalid band %d", uint8(b))
	}
	return []byte(bandNames[b]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *Band) UnmarshalText(text []byte) error {
	parsed, err := ParseBand(string(text))
	if err != nil {
		return err
	}
	*b = parsed
	return nil
}
