package decisiontrace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// Limits and defaults of a Config.
const (
	// MaxSize bounds Config.Size. A record holds a few names and scores per candidate endpoint, so its size grows
	// with the pool; the bound keeps the ring's memory in proportion (about 10k records of a 100-endpoint pool hold
	// 100 MB at most).
	MaxSize = 10000
	// DefaultRate is the default Config.Rate: enough to follow a handful of test requests or sample a busy pool,
	// little enough that tracing costs nothing a pool would notice.
	DefaultRate = 10
	// LogLevel is the verbosity each committed record is logged at (upstream's VERBOSE).
	LogLevel = 3
)

// Config says which requests a Recorder traces and how many records it keeps.
type Config struct {
	// Size is how many records the ring keeps, the newest replacing the oldest: 1..MaxSize.
	Size int
	// Header, when not empty, traces only requests that carry this header (any non-empty value); otherwise every
	// request may be traced.
	Header string
	// Rate bounds the requests traced per second (a token bucket whose burst is the rate, at least 1); 0 means no
	// bound. It is what keeps a client that sends Header on every request from making the EPP trace them all.
	Rate float64
	// Clock stamps records and drives the rate. Default: the wall clock.
	Clock clock.PassiveClock
	// Logger receives each committed record at LogLevel. Default: discarded.
	Logger logr.Logger
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	if c.Size < 1 || c.Size > MaxSize {
		errs = append(errs, fmt.Errorf("decision trace size must be between 1 and %d, got %d", MaxSize, c.Size))
	}
	if !(c.Rate >= 0) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("decision trace rate must be a non-negative number of requests per second, got %v", c.Rate))
	}
	return errors.Join(errs...)
}

// Recorder keeps the last Config.Size committed records.
//
// Concurrency: safe for concurrent use.
type Recorder struct {
	clock   clock.PassiveClock
	logger  logr.Logger
	header  string
	limiter *rate.Limiter // nil: no bound

	mu    sync.Mutex
	ring  []*Record // ring[next] is the oldest once full
	next  int
	total uint64
}

// New returns a Recorder for a valid cfg.
func New(cfg Config) (*Recorder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	r := &Recorder{clock: cfg.Clock, logger: cfg.Logger, header: cfg.Header, ring: make([]*Record, 0, cfg.Size)}
	if cfg.Rate > 0 {
		r.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, int(math.Ceil(cfg.Rate))))
	}
	return r, nil
}

// Header returns Config.Header.
func (r *Recorder) Header() string { return r.header }

// Start returns a Trace for one request and ctx carrying it. The request is traced once Begin selects it.
func (r *Recorder) Start(ctx context.Context) (context.Context, *Trace) {
	t := &Trace{recorder: r}
	return NewContext(ctx, t), t
}

// selects reports whether a request received at now is traced: it carries the opt-in header when one is
// configured, and the rate allows one more.
func (r *Recorder) selects(optedIn bool, now time.Time) bool {
	if r.header != "" && !optedIn {
		return false
	}
	return r.limiter == nil || r.limiter.AllowN(now, 1)
}

// add stores a committed record, replacing the oldest when the ring is full, and logs it.
func (r *Recorder) add(rec *Record) {
	r.mu.Lock()
	if len(r.ring) < cap(r.ring) {
		r.ring = append(r.ring, rec)
	} else {
		r.ring[r.next] = rec
		r.next = (r.next + 1) % len(r.ring)
	}
	r.total++
	r.mu.Unlock()
	r.logger.V(LogLevel).Info("Routing decision", "requestId", rec.RequestID, "decision", rec)
}

// Records returns the kept records, newest first: those of request id if id is not empty, at most limit if limit is
// positive.
func (r *Recorder) Records(id string, limit int) []*Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recordsLocked(id, limit)
}

func (r *Recorder) recordsLocked(id string, limit int) []*Record {
	var out []*Record
	for i := range r.ring {
		// Newest first: the slot before next, going backwards.
		rec := r.ring[(r.next-1-i+2*len(r.ring))%len(r.ring)]
		if id != "" && rec.RequestID != id {
			continue
		}
		out = append(out, rec)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out
}

// Page is what ServeHTTP answers.
type Page struct {
	// Capacity is Config.Size; Recorded counts every record committed since the start, Header is Config.Header.
	Capacity  int       `json:"capacity"`
	Recorded  uint64    `json:"recorded"`
	Header    string    `json:"header,omitempty"`
	Decisions []*Record `json:"decisions"`
}

// ServeHTTP answers GET with the kept records as a JSON Page, newest first; the query parameters request_id and
// limit select them as Records does.
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q := req.URL.Query()
	limit := 0
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("limit must be a non-negative integer, got %q", s), http.StatusBadRequest)
			return
		}
		limit = n
	}
	page := Page{Capacity: cap(r.ring), Header: r.header, Decisions: []*Record{}}
	r.mu.Lock()
	page.Recorded = r.total
	if recs := r.recordsLocked(q.Get("request_id"), limit); recs != nil {
		page.Decisions = recs
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(page)
}
