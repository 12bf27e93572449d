package decisiontrace

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// Trace collects one request's Record. The runner starts it with the request (Recorder.Start), the hooks add what
// they decide, and the first of Routed, Answered or End commits it. Every method is a no-op on a nil Trace, on a
// request that is not traced (Begin did not select it) and after the commit.
type Trace struct {
	recorder *Recorder
	// active is set while a selected request's record is open, so hooks skip their bookkeeping with one load when
	// it is not.
	active atomic.Bool

	mu      sync.Mutex
	rec     *Record
	profile *profileRun // the profile being run
}

// profileRun is a profile's record while it runs.
type profileRun struct {
	Profile
	scores map[string]map[string]float64 // endpoint -> scorer -> score
	totals map[string]float64
}

type contextKey struct{}

// NewContext returns ctx carrying t.
func NewContext(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, contextKey{}, t)
}

// FromContext returns the Trace ctx carries, or nil.
func FromContext(ctx context.Context) *Trace {
	t, _ := ctx.Value(contextKey{}).(*Trace)
	return t
}

// Active reports whether t records a request: hooks check it before they compute what they would add.
func (t *Trace) Active() bool { return t != nil && t.active.Load() }

// Begin opens the record of request id, received now, if the recorder selects it: optedIn tells whether the request
// carries the opt-in header (see Config.Header). A Trace begins at most once.
func (t *Trace) Begin(id string, optedIn bool) {
	if t == nil {
		return
	}
	now := t.recorder.clock.Now()
	if !t.recorder.selects(optedIn, now) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rec != nil {
		return
	}
	t.rec = &Record{RequestID: id, Received: now}
	t.active.Store(true)
}

// Request notes the request's model, objective and priority; empty values leave those known.
func (t *Trace) Request(model, objective string, priority int) {
	t.update(func(r *Record) {
		if model != "" {
			r.Model = model
		}
		if objective != "" {
			r.Objective = objective
		}
		r.Priority = priority
	})
}

// Admitted records Sluice admission's decision.
func (t *Trace) Admitted(a Admission) {
	t.update(func(r *Record) { r.Admission = &a })
}

// BeginProfile starts the record of scheduling profile name over candidates.
func (t *Trace) BeginProfile(name string, candidates []string) {
	t.update(func(*Record) {
		t.profile = &profileRun{Profile: Profile{Name: name, Candidates: candidates}}
	})
}

// Filtered records that filter plugin turned the candidates before into after (names, in any order).
func (t *Trace) Filtered(plugin string, before, after []string) {
	t.updateProfile(func(p *profileRun) {
		f := Filter{Plugin: plugin, Kept: len(after)}
		if len(after) < len(before) {
			kept := make(map[string]struct{}, len(after))
			for _, name := range after {
				kept[name] = struct{}{}
			}
			for _, name := range before {
				if _, ok := kept[name]; !ok {
					f.Removed = append(f.Removed, name)
				}
			}
		}
		p.Filters = append(p.Filters, f)
	})
}

// Scored records scorer plugin's scores, by endpoint, and its weight in the profile.
func (t *Trace) Scored(plugin string, weight float64, scores map[string]float64) {
	t.updateProfile(func(p *profileRun) {
		p.Scorers = append(p.Scorers, Scorer{Plugin: plugin, Weight: weight})
		if p.scores == nil {
			p.scores = map[string]map[string]float64{}
		}
		for ep, s := range scores {
			if p.scores[ep] == nil {
				p.scores[ep] = map[string]float64{}
			}
			p.scores[ep][plugin] = s
		}
	})
}

// Weighed records the weighted totals the picker is handed, by endpoint.
func (t *Trace) Weighed(totals map[string]float64) {
	t.updateProfile(func(p *profileRun) { p.totals = totals })
}

// EndProfile closes the running profile's record with the endpoints it picked, or the error it failed with.
func (t *Trace) EndProfile(picked []string, err error) {
	t.updateProfile(func(p *profileRun) {
		p.Picked = picked
		if err != nil {
			p.Error = err.Error()
		}
		for ep, total := range p.totals {
			p.Endpoints = append(p.Endpoints, EndpointScores{Endpoint: ep, Scores: p.scores[ep], Total: total})
		}
		slices.SortFunc(p.Endpoints, func(a, b EndpointScores) int {
			return cmp.Or(cmp.Compare(b.Total, a.Total), cmp.Compare(a.Endpoint, b.Endpoint))
		})
		t.rec.Profiles = append(t.rec.Profiles, p.Profile)
		t.profile = nil
	})
}

// Routed commits the record of a request the EPP sent to endpoint.
func (t *Trace) Routed(endpoint string) {
	t.commit(func(r *Record) {
		r.Outcome, r.Endpoint = Routed, endpoint
	})
}

// Answered commits the record of a request the EPP answered itself with status; shedReason, retryAfter and message
// are the answer's x-sluice-shed-reason, Retry-After and error message (each may be empty).
func (t *Trace) Answered(status int, shedReason, retryAfter, message string) {
	t.commit(func(r *Record) {
		r.Outcome, r.Status, r.ShedReason, r.RetryAfter, r.Error = Answered, status, shedReason, retryAfter, message
	})
}

// End commits the record of a request that ended without Routed or Answered.
func (t *Trace) End() {
	t.commit(func(r *Record) { r.Outcome = Ended })
}

// update runs f on the open record.
func (t *Trace) update(f func(*Record)) {
	if !t.Active() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rec != nil && t.active.Load() {
		f(t.rec)
	}
}

// updateProfile runs f on the running profile's record.
func (t *Trace) updateProfile(f func(*profileRun)) {
	t.update(func(*Record) {
		if t.profile != nil {
			f(t.profile)
		}
	})
}

// commit completes the open record with f, closes it and hands it to the recorder.
func (t *Trace) commit(f func(*Record)) {
	if !t.Active() {
		return
	}
	t.mu.Lock()
	r := t.rec
	if r == nil || !t.active.Load() {
		t.mu.Unlock()
		return
	}
	t.active.Store(false)
	if t.profile != nil { // a profile that never ended: the request was answered while it ran
		t.rec.Profiles = append(t.rec.Profiles, t.profile.Profile)
		t.profile = nil
	}
	f(r)
	r.Decided = t.recorder.clock.Now()
	t.mu.Unlock()
	t.recorder.add(r)
}
