package conformance

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Profile is the conformance profile a case belongs to, named as upstream's
// conformance suite names its future profiles ("EPP and ModelServer").
type Profile string

const (
	// EPPProfile holds the endpoint picker protocol (proposal 004) and what
	// an EPP deployment needs besides: pool membership, health, robustness.
	EPPProfile Profile = "EPP"
	// ModelServerProfile holds the model server protocol (proposal 003) as
	// the EPP consumes it: the metrics it scrapes.
	ModelServerProfile Profile = "ModelServer"
)

// Documents in the GIE v1.5.0 module that cases cite.
const (
	proposal003  = "docs/proposals/003-model-server-protocol/README.md"
	proposal004  = "docs/proposals/004-endpoint-picker-protocol/README.md"
	proposal1816 = "docs/proposals/1816-inferenceomodelrewrite/README.md"
)

// Ref cites the line of a GIE v1.5.0 document that a case checks.
type Ref struct {
	// Path is relative to the module root of
	// sigs.k8s.io/gateway-api-inference-extension@v1.5.0, or of its
	// Module ("conformance": the conformance module) when set.
	Path string
	Line int
	// Quote is text on that line; TestCitations checks it is there, so a
	// citation cannot drift.
	Quote  string
	Module string
}

func (r Ref) String() string {
	m := "gateway-api-inference-extension"
	if r.Module != "" {
		m += "/" + r.Module
	}
	return fmt.Sprintf("%s@%s %s:%d", m, GIEVersion, r.Path, r.Line)
}

// Case is one check of the profile.
type Case struct {
	// Name is unique within its group.
	Name    string
	Profile Profile
	Ref     Ref
	// Requirement says, in a sentence, what the case requires.
	Requirement string
	Run         func(t *T, f *Fixture)
}

// Group is a set of cases that share one fixture (a pool and an EPP per
// implementation), run in order.
type Group struct {
	Name string
	// Fixture describes what the cases share; nil means each case sets up
	// what it needs itself (f then carries only the environment).
	Fixture *FixtureSpec
	// GIECRDsOnly runs the group before the implementation's own CRDs are
	// installed; such groups come first.
	GIECRDsOnly bool
	Cases       []Case
}

// ID is the case's name in reports: group/case.
func (g Group) ID(c Case) string { return g.Name + "/" + c.Name }

// caseTimeout bounds one case; a case still running then has hung.
const caseTimeout = 3 * time.Minute

// T is what a case reports to: its failures and its observations. It
// embeds the case's subtest for logging and cleanups; failing through it
// records the failure instead of failing the subtest, so that a known
// finding can be reported without failing the suite. FailNow and Fatal end
// the case's goroutine.
type T struct {
	testing.TB
	ctx context.Context

	mu       sync.Mutex
	failures []string
	observed map[string]string
}

// Context is the case's context: it ends after caseTimeout.
func (t *T) Context() context.Context { return t.ctx }

// Observe records what the implementation did, as the differential compares
// it across implementations: aspect is a short name, the value a
// deterministic description (a status code, a header's presence, a body's
// kind), never a value that varies between runs.
func (t *T) Observe(aspect, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observed[aspect] = fmt.Sprintf(format, args...)
}

func (t *T) Error(args ...any)                 { t.fail(fmt.Sprint(args...)) }
func (t *T) Errorf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }
func (t *T) Fail()                             { t.fail("failed") }
func (t *T) FailNow()                          { t.fail("failed"); runtime.Goexit() }
func (t *T) Fatal(args ...any)                 { t.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (t *T) Fatalf(format string, args ...any) {
	t.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (t *T) Skip(args ...any)                 { t.Fatal(append([]any{"a case cannot skip: "}, args...)...) }
func (t *T) Skipf(format string, args ...any) { t.Fatalf("a case cannot skip: "+format, args...) }
func (t *T) SkipNow()                         { t.Fatal("a case cannot skip") }

func (t *T) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.failures) > 0
}

func (t *T) fail(msg string) {
	t.TB.Helper()
	t.mu.Lock()
	t.failures = append(t.failures, msg)
	t.mu.Unlock()
	t.TB.Log("FAIL: " + msg)
}

// Result is one case's outcome for one implementation.
type Result struct {
	Implementation string
	Case           string
	Profile        Profile
	Ref            Ref
	Failures       []string
	Observed       map[string]string
}

// Passed reports whether the case found nothing wrong.
func (r Result) Passed() bool { return len(r.Failures) == 0 }

// runCase runs c in its own goroutine (so Fatal ends only the case) and
// returns its result.
func runCase(st testing.TB, impl string, id string, c Case, f *Fixture) Result {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	ct := &T{TB: st, ctx: ctx, observed: map[string]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ct, f)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		ct.fail(fmt.Sprintf("the case did not finish within %v: the implementation hung", caseTimeout))
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return Result{Implementation: impl, Case: id, Profile: c.Profile, Ref: c.Ref,
		Failures: slices.Clone(ct.failures), Observed: maps.Clone(ct.observed)}
}

// summary is a one-line account of a result for logs.
func (r Result) summary() string {
	if r.Passed() {
		return "pass"
	}
	return "fail: " + strings.Join(r.Failures, "; ")
}
