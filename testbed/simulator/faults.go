package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Faults are the injected failures of one simulated server. The zero value
// injects nothing.
type Faults struct {
	// Crash makes the server drop every connection without an answer, as a
	// dead process would: in-flight requests are aborted and the engine
	// restarts empty (KV and prefix cache, GPU-resident adapters lost).
	// Clearing it "restarts" the server. /admin/faults keeps working.
	Crash bool
	// Hang makes new requests (every endpoint but /admin/faults) block
	// without an answer until the fault is cleared, the client goes away or
	// the server closes; in-flight requests go on.
	Hang bool
	// ErrorRate is the probability that an inference request is answered
	// with a 500 OpenAI error instead of being served.
	ErrorRate float64
	// DropStreamRate is the probability that a streaming response is cut
	// (connection aborted, no [DONE]) after half of its tokens.
	DropStreamRate float64
	// MetricsDelay delays every /metrics answer.
	MetricsDelay time.Duration
	// Slowdown makes every engine step take this many times its modelled
	// duration (a throttled or degraded GPU): 10 serves ten times slower.
	// 0 or 1 is normal speed.
	Slowdown float64
}

// Validate reports out-of-range fields.
func (f Faults) Validate() error {
	var errs []error
	if f.ErrorRate < 0 || f.ErrorRate > 1 {
		errs = append(errs, fmt.Errorf("error_rate must be within [0, 1], got %v", f.ErrorRate))
	}
	if f.DropStreamRate < 0 || f.DropStreamRate > 1 {
		errs = append(errs, fmt.Errorf("drop_stream_rate must be within [0, 1], got %v", f.DropStreamRate))
	}
	if f.MetricsDelay < 0 {
		errs = append(errs, fmt.Errorf("metrics_delay must not be negative, got %v", f.MetricsDelay))
	}
	if f.Slowdown != 0 && !(f.Slowdown >= 1 && f.Slowdown <= maxSlowdown) {
		errs = append(errs, fmt.Errorf("slowdown must be 0 (none) or within [1, %v], got %v", maxSlowdown, f.Slowdown))
	}
	return errors.Join(errs...)
}

// maxSlowdown bounds the slowdown fault: step durations stay far from
// overflowing time.Duration.
const maxSlowdown = 1000

// faultsJSON is the wire form of Faults for POST/GET /admin/faults, e.g.
// {"crash":false,"hang":false,"error_rate":0.1,"drop_stream_rate":0,"metrics_delay":"2s","slowdown":10}.
type faultsJSON struct {
	Crash          bool    `json:"crash"`
	Hang           bool    `json:"hang"`
	ErrorRate      float64 `json:"error_rate"`
	DropStreamRate float64 `json:"drop_stream_rate"`
	MetricsDelay   string  `json:"metrics_delay"`
	Slowdown       float64 `json:"slowdown"`
}

// MarshalJSON writes the /admin/faults form.
func (f Faults) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultsJSON{f.Crash, f.Hang, f.ErrorRate, f.DropStreamRate, f.MetricsDelay.String(), f.Slowdown})
}

// UnmarshalJSON reads the /admin/faults form; unknown fields are errors, so
// a typo cannot silently inject nothing.
func (f *Faults) UnmarshalJSON(data []byte) error {
	var j faultsJSON
	if err := decodeStrict(data, &j); err != nil {
		return err
	}
	var d time.Duration
	if j.MetricsDelay != "" {
		var err error
		if d, err = time.ParseDuration(j.MetricsDelay); err != nil {
			return fmt.Errorf("metrics_delay: %w", err)
		}
	}
	*f = Faults{Crash: j.Crash, Hang: j.Hang, ErrorRate: j.ErrorRate, DropStreamRate: j.DropStreamRate, MetricsDelay: d,
		Slowdown: j.Slowdown}
	return nil
}

// faultState holds the current Faults and a channel closed on every change,
// so blocked requests (Hang) notice when to re-check.
type faultState struct {
	mu      sync.Mutex
	faults  Faults
	changed chan struct{}
}

func newFaultState(f Faults) *faultState {
	return &faultState{faults: f, changed: make(chan struct{})}
}

func (s *faultState) get() (Faults, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults, s.changed
}

// set replaces the faults and returns the previous ones.
func (s *faultState) set(f Faults) Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.faults
	s.faults = f
	close(s.changed)
	s.changed = make(chan struct{})
	return old
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
