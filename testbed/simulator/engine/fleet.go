package engine

import (
	"fmt"
	"strconv"
	"strings"
)

// FleetEntry is Count servers of one hardware profile.
type FleetEntry struct {
	Profile string
	Count   int
}

// ParseFleet parses a mixed fleet, "profile:count,...", e.g. "h100:2,a10g:2" (the syntax of vllm-sim --fleet).
// Every profile must be known (see Profile) and every count positive.
func ParseFleet(spec string) ([]FleetEntry, error) {
	var out []FleetEntry
	for part := range strings.SplitSeq(spec, ",") {
		name, count, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("fleet entry %q: want profile:count", part)
		}
		if _, err := Profile(name); err != nil {
			return nil, fmt.Errorf("fleet entry %q: %w", part, err)
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("fleet entry %q: count must be a positive integer", part)
		}
		out = append(out, FleetEntry{Profile: name, Count: n})
	}
	return out, nil
}

// FleetConfigs parses a fleet spec (see ParseFleet) into one profile Config per server, in spec order.
func FleetConfigs(spec string) ([]Config, error) {
	entries, err := ParseFleet(spec)
	if err != nil {
		return nil, err
	}
	var out []Config
	for _, e := range entries {
		cfg, _ := Profile(e.Profile) // known: ParseFleet checked it
		for range e.Count {
			out = append(out, cfg)
		}
	}
	return out, nil
}
