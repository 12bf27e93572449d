package benchsuite

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-gw/sluice/testbed/dataplane"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// ScenarioFileName is the name of a scenario file inside its folder.
const ScenarioFileName = "scenario.yaml"

// Defaults of a scenario file.
const (
	DefaultDuration = 30 * time.Second
	DefaultDrain    = 15 * time.Second
	DefaultSeed     = 11
)

// Limits that keep a mistyped scenario from running for hours.
const (
	maxDuration = 10 * time.Minute
	maxAdapters = 1000
)

// The contenders every scenario runs. Their names are reserved.
const (
	// RoundRobin is the data plane rotating over the fleet, with no EPP.
	RoundRobin = "round-robin"
	// UpstreamDefault is upstream v1.5.0's default scheduling profile and
	// admission, run in the Sluice EPP binary with no configuration.
	UpstreamDefault = "upstream-default"
	// Sluice is Sluice admission with Sluice's default profile, or the
	// profile and policy the scenario names.
	Sluice = "sluice"
	// Unloaded is the reference run of a scenario with an unloaded class:
	// that class alone at a low rate, through the sluice contender's EPP.
	Unloaded = "unloaded"
)

// ScenarioFile is the schema of a scenario file (YAML or JSON; unknown
// fields are rejected). Paths are relative to the file's folder.
//
//	name: mixed-gpu                  # default: the folder's name; [a-z0-9-]
//	order: 1                         # position in the report (then by name)
//	title: Mixed GPU generations
//	description: What it shows and why its parameters are what they are.
//	fleet: h100:2,a10g:2             # vllm-sim --fleet: profile:count,...
//	output_length: ceiling           # answers stop at a uniform length in [1, max_tokens] (vllm-sim --output-length; default exact)
//	mix: mix.yaml                    # a loadgen mix file, or the mix inline
//	adapters:                        # optional LoRA adapters, see AdaptersFile
//	  {count: 40, zipf_s: 1.0, share: 0.7}
//	arrival: {kind: poisson, rate: 40}   # or constant, or bursty with burst_on/burst_off
//	duration: 30s                    # issuing window (default 30s)
//	drain: 15s                       # then requests still running get this long (default 15s)
//	seed: 11                         # request sequence and arrival times (default 11)
//	interleave: true                 # real time: all contenders up at once, requests dealt among them in turns
//	retry: {max_attempts: 3, max_wait: 10s}  # clients honouring Retry-After
//	slo: {ttft: 1s}                  # goodput bound for classes without their own
//	objectives: objectives.yaml      # InferenceObjectives for the EPP (static mode)
//	sluice:                          # overrides of the sluice contender
//	  epp_config: sluice.yaml        # an EndpointPickerConfig
//	  flow_control_policy: policy.yaml
//	extra_contenders:                # measured and reported, never targets
//	  - {name: upstream-flow-control, router: epp, epp_config: upstream-fc.yaml}
//	capacity: 60                     # req/s the fleet was measured to serve of this mix
//	unloaded: {class: critical, rate: 6}  # reference run: the class alone at a low rate
//	targets:                         # Sluice's figures: a ratio against a baseline, or a value
//	  - {figure: ttft_p99, vs: round-robin, at_most: 0.05}
//	  - {figure: throughput, vs: round-robin, at_least: 1.08}
//	  - {figure: every, vs: round-robin, within: 0.05}
//	  - {figure: ttft_p99, class: critical, vs: unloaded, at_most: 2}
//	  - {figure: shed, class: critical, at_most: 0}
//	replicas:                        # the sluice contender again with N EPP replicas (see ReplicasFile)
//	  {counts: [2, 4], balance: [round-robin, random]}
//	shape: large-batch               # the server shape of fleet, for the report
//	shapes:                          # the same scenario on other fleets, one scenario each
//	  - {name: slot-limited, fleet: "slot4:12", arrival: {kind: poisson, rate: 19}, capacity: 9.6, unloaded_rate: 1}
//
// Every scenario also gets the target "no worse than upstream-default on
// every figure" (see NoWorseTolerance).
//
// A shape becomes the scenario <name>-<shape> (of family <name>): the same
// mix, objectives, Sluice overrides and targets on the shape's fleet, with
// its own arrival (default: the scenario's), capacity and unloaded rate. The
// scenario's extra contenders stay with its own fleet (they are often sized
// to it); a shape lists its own.
type ScenarioFile struct {
	Name        string `json:"name,omitempty"`
	Order       int    `json:"order,omitempty"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	Fleet       string `json:"fleet"`
	// OutputLength is how long the simulated servers' answers to requests
	// with max_tokens are: "exact" (the default) or "ceiling", uniform in
	// [1, max_tokens] as when real clients set max_tokens as a bound
	// (simulator.OutputLength).
	OutputLength string `json:"output_length,omitempty"`
	// Mix is a path (a YAML string) or an inline mix (a YAML mapping).
	Mix      json.RawMessage `json:"mix"`
	Adapters *AdaptersFile   `json:"adapters,omitempty"`
	Arrival  ArrivalFile     `json:"arrival"`
	Duration string          `json:"duration,omitempty"`
	Drain    string          `json:"drain,omitempty"`
	Seed     *uint64         `json:"seed,omitempty"`
	// Interleave runs the contenders (but the unloaded reference) in one
	// load in real time: every contender's fleet, EPP and data plane up at
	// once, and the requests dealt among them in turns (loadgen's Targets),
	// each contender at the scenario's arrival rate. Load swings on the
	// machine then hit every contender alike; one contender after another,
	// they hit whichever ran at the time. Dealt in shuffled rounds, each
	// contender's arrivals are more regular than the scenario's process.
	// Not with multi-turn classes (a chat's turns would reach different
	// contenders). Engines that run no processes (virtual time) ignore it.
	Interleave bool       `json:"interleave,omitempty"`
	Retry      *RetryFile `json:"retry,omitempty"`
	SLO        SLOFile    `json:"slo,omitempty"`
	// Objectives is the path of an InferenceObjectives file given to every
	// EPP contender (--inference-objectives-file).
	Objectives      string               `json:"objectives,omitempty"`
	Sluice          *SluiceFile          `json:"sluice,omitempty"`
	ExtraContenders []ExtraContenderFile `json:"extra_contenders,omitempty"`
	Targets         []TargetFile         `json:"targets,omitempty"`
	// Capacity is what Fleet was measured to serve of Mix, in requests per
	// second: the report gives the offered load as its multiple, and
	// Retry-After figures count retries sent while the arrival rate was
	// below it.
	Capacity float64 `json:"capacity,omitempty"`
	// Unloaded adds the reference run Unloaded, which targets "vs: unloaded"
	// compare with.
	Unloaded *UnloadedFile `json:"unloaded,omitempty"`
	// Replicas adds the sluice contender run with several EPP replicas.
	Replicas *ReplicasFile `json:"replicas,omitempty"`
	// Shape names Fleet's server shape; Shapes runs the scenario on others.
	Shape  string      `json:"shape,omitempty"`
	Shapes []ShapeFile `json:"shapes,omitempty"`
}

// UnloadedFile is the unloaded reference: Class alone, Poisson at Rate
// (low, so the class meets no contention), with the sluice contender's EPP.
type UnloadedFile struct {
	Class string  `json:"class"`
	Rate  float64 `json:"rate"`
}

// ShapeFile is the scenario on another fleet (see ScenarioFile).
type ShapeFile struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Fleet       string `json:"fleet"`
	// Arrival replaces the scenario's (the load is usually a multiple of
	// the shape's capacity).
	Arrival  *ArrivalFile `json:"arrival,omitempty"`
	Capacity float64      `json:"capacity,omitempty"`
	// UnloadedRate is the unloaded reference's rate on this fleet; required
	// when the scenario has an unloaded reference.
	UnloadedRate    float64              `json:"unloaded_rate,omitempty"`
	ExtraContenders []ExtraContenderFile `json:"extra_contenders,omitempty"`
	// OutputLength replaces the scenario's (see ScenarioFile.OutputLength).
	OutputLength string `json:"output_length,omitempty"`
}

// AdaptersFile registers Count LoRA adapters, adapter-00 ... on every
// simulated server and turns a Share of the template class's requests into
// requests for them, adapter k (1-based) with probability proportional to
// 1/k^ZipfS. The rest of that class stays on the base model.
type AdaptersFile struct {
	Count int     `json:"count"`
	ZipfS float64 `json:"zipf_s"`
	Share float64 `json:"share"`
	// Class is the mix class that becomes adapter traffic; optional when the
	// mix has one class.
	Class string `json:"class,omitempty"`
}

// Durations in scenario files are Go duration strings: "250ms", "30s".

// ArrivalFile is loadgen.ArrivalConfig as written in a scenario file.
type ArrivalFile struct {
	Kind     string      `json:"kind"`
	Rate     float64     `json:"rate,omitempty"`
	BurstOn  string      `json:"burst_on,omitempty"`
	BurstOff string      `json:"burst_off,omitempty"`
	Phases   []PhaseFile `json:"phases,omitempty"`
}

// PhaseFile is one phase of phased arrivals: {rate: 80, duration: 20s}.
type PhaseFile struct {
	Rate     float64 `json:"rate"`
	Duration string  `json:"duration"`
}

// RetryFile is loadgen.RetryPolicy as written in a scenario file.
type RetryFile struct {
	MaxAttempts int    `json:"max_attempts"`
	MaxWait     string `json:"max_wait,omitempty"`
}

// SLOFile is loadgen.SLO as written in a scenario file.
type SLOFile struct {
	TTFT string `json:"ttft,omitempty"`
	ITL  string `json:"itl,omitempty"`
	E2E  string `json:"e2e,omitempty"`
}

// SluiceFile overrides the sluice contender's EPP configuration; each path
// left empty keeps Sluice's default.
type SluiceFile struct {
	EPPConfig         string `json:"epp_config,omitempty"`
	FlowControlPolicy string `json:"flow_control_policy,omitempty"`
}

// ExtraContenderFile declares a contender beyond the three every scenario
// runs, e.g. an upstream feature that is not in its default profile.
type ExtraContenderFile struct {
	Name   string `json:"name"`
	Router Router `json:"router"`
	// SluiceAdmission turns Sluice admission on; a FlowControlPolicy does
	// too.
	SluiceAdmission   bool   `json:"sluice_admission,omitempty"`
	EPPConfig         string `json:"epp_config,omitempty"`
	FlowControlPolicy string `json:"flow_control_policy,omitempty"`
	// RequestBodyMode is how the data plane sends request bodies to the
	// EPP, as Envoy's ext_proc request_body_mode: full-duplex-streamed
	// (GIE's, the default) or buffered. Real time only: the virtual engine
	// has no data plane.
	RequestBodyMode string `json:"request_body_mode,omitempty"`
	// ResponseObserver shows the EPP each response on an observer stream instead of the routing stream (the data
	// plane's --response-observer, the EPP's --response-observer-wait). Real time only, as RequestBodyMode.
	ResponseObserver bool `json:"response_observer,omitempty"`
}

// TargetFile is one target: exactly one of AtMost, AtLeast and Within.
// Vs is round-robin or upstream-default (Sluice's figure over that
// contender's), unloaded (Sluice's figure for Class over the unloaded
// reference's) or empty (Sluice's figure itself, at most or at least the
// bound; the counts of CountFigures are only judged so). Class takes the
// figure over that class's requests instead of all.
type TargetFile struct {
	Figure  string   `json:"figure"`
	Class   string   `json:"class,omitempty"`
	Vs      string   `json:"vs,omitempty"`
	AtMost  *float64 `json:"at_most,omitempty"`
	AtLeast *float64 `json:"at_least,omitempty"`
	Within  *float64 `json:"within,omitempty"`
}

// Router is how a contender routes requests.
type Router string

const (
	// RouterRoundRobin is the data plane rotating over the fleet, no EPP.
	RouterRoundRobin Router = "round-robin"
	// RouterEPP is the data plane asking the Sluice EPP binary.
	RouterEPP Router = "epp"
)

// Scenario is a validated scenario: plain inputs any engine can run.
type Scenario struct {
	Name        string `json:"name"`
	Order       int    `json:"order"`
	Title       string `json:"title"`
	Description string `json:"description"`
	// Dir is the folder of the scenario file ("" for scenarios built in
	// code).
	Dir string `json:"dir,omitempty"`
	// Fleet is the simulated fleet in vllm-sim --fleet syntax; FleetSize is
	// its number of servers.
	Fleet     string `json:"fleet"`
	FleetSize int    `json:"fleet_size"`
	// OutputLength: see ScenarioFile.OutputLength ("" is exact).
	OutputLength simulator.OutputLength `json:"output_length,omitempty"`
	// Model is the base model every server serves (the mix's).
	Model string `json:"model"`
	// Adapters are the LoRA adapters registered on every server.
	Adapters []string `json:"adapters,omitempty"`
	// Mix is the parsed request mix, adapter classes included; MixSource is
	// the file it came from or "inline".
	Mix       *loadgen.Mix          `json:"mix"`
	MixSource string                `json:"mix_source"`
	Arrival   loadgen.ArrivalConfig `json:"arrival"`
	Duration  time.Duration         `json:"duration_ns"`
	Drain     time.Duration         `json:"drain_ns"`
	Seed      uint64                `json:"seed"`
	// Interleave: see ScenarioFile.Interleave.
	Interleave bool                `json:"interleave,omitempty"`
	Retry      loadgen.RetryPolicy `json:"retry"`
	SLO        loadgen.SLO         `json:"slo"`
	// Objectives is an InferenceObjectives YAML file's content, nil for
	// none; ObjectivesSource is its path.
	Objectives       []byte `json:"objectives,omitempty"`
	ObjectivesSource string `json:"objectives_source,omitempty"`
	// Family is the scenario file's name, Shape the server shape of this
	// scenario's fleet ("" when the file names none); a shape of the file
	// is the scenario <Family>-<Shape>. Shapes holds them (LoadScenarios
	// lists them after this one).
	Family string      `json:"family"`
	Shape  string      `json:"shape,omitempty"`
	Shapes []*Scenario `json:"-"`
	// Capacity is what the fleet was measured to serve of the mix (req/s),
	// 0 when unknown.
	Capacity float64 `json:"capacity,omitempty"`
	// Unloaded is the unloaded reference, nil for none.
	Unloaded *UnloadedReference `json:"unloaded,omitempty"`
	// Contenders in run order: round-robin, upstream-default, the extras,
	// sluice, and the unloaded reference when there is one.
	Contenders []Contender `json:"contenders"`
	// Targets are the declared targets followed by the implicit one against
	// upstream-default.
	Targets []Target `json:"targets"`
}

// UnloadedReference is a class's run alone at a low rate: what "its
// unloaded value" means in a target.
type UnloadedReference struct {
	Class string  `json:"class"`
	Rate  float64 `json:"rate"`
}

// Load is the mix and arrival process contender c runs: the scenario's,
// or for the unloaded reference its class alone at its rate.
func (s *Scenario) Load(c Contender) (*loadgen.Mix, loadgen.ArrivalConfig) {
	if !c.Unloaded || s.Unloaded == nil {
		return s.Mix, s.Arrival
	}
	mix := *s.Mix
	i := slices.IndexFunc(mix.Classes, func(cl loadgen.Class) bool { return cl.Name == s.Unloaded.Class })
	mix.Classes = mix.Classes[i : i+1 : i+1]
	return &mix, loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: s.Unloaded.Rate}
}

// Contender is one system under comparison.
type Contender struct {
	Name   string `json:"name"`
	Router Router `json:"router"`
	// EndpointPickerConfig is the EPP's --config-file content; nil runs the
	// binary's default (upstream's default profile, or Sluice's when Sluice
	// admission is on). EndpointPickerConfigSource is its path.
	EndpointPickerConfig       []byte `json:"endpoint_picker_config,omitempty"`
	EndpointPickerConfigSource string `json:"endpoint_picker_config_source,omitempty"`
	// SluiceAdmission turns on Sluice admission; FlowControlPolicy is the
	// --flow-control-config content, nil for Sluice's default policy.
	SluiceAdmission         bool   `json:"sluice_admission"`
	FlowControlPolicy       []byte `json:"flow_control_policy,omitempty"`
	FlowControlPolicySource string `json:"flow_control_policy_source,omitempty"`
	// Extra marks a contender the scenario added; it is reported but no
	// target refers to it.
	Extra bool `json:"extra,omitempty"`
	// Unloaded marks the unloaded reference (Scenario.Load): the sluice
	// contender's EPP with one class at a low rate.
	Unloaded bool `json:"unloaded,omitempty"`
	// Replicas is the number of EPP replicas (0 and 1: one), Balance how
	// the data plane spreads requests over them (see ReplicasFile).
	Replicas int    `json:"replicas,omitempty"`
	Balance  string `json:"balance,omitempty"`
	// EndpointOwnership partitions the fleet among the replicas (see
	// ReplicasFile).
	EndpointOwnership bool `json:"endpoint_ownership,omitempty"`
	// PeerExchange adds the replicas' peer exchange to EndpointOwnership (see
	// ReplicasFile).
	PeerExchange bool `json:"peer_exchange,omitempty"`
	// RequestBodyMode is the data plane's --request-body-mode; "" is its
	// default, GIE's FULL_DUPLEX_STREAMED (see ExtraContenderFile).
	RequestBodyMode string `json:"request_body_mode,omitempty"`
	// ResponseObserver: the data plane's --response-observer and the EPP's --response-observer-wait (see
	// ExtraContenderFile).
	ResponseObserver bool `json:"response_observer,omitempty"`
}

// Describe says in a few words what the contender runs.
func (c Contender) Describe() string {
	if c.Unloaded {
		sluice := c
		sluice.Unloaded = false
		return "reference: one class alone at a low rate; " + sluice.Describe()
	}
	if c.Router == RouterRoundRobin {
		return "data plane, round-robin, no EPP"
	}
	if c.Replicas > 1 {
		one := c
		one.Replicas, one.Balance = 0, ""
		owned := ""
		if c.EndpointOwnership {
			owned = ", each owning a share of the endpoints"
			one.EndpointOwnership = false
		}
		if c.PeerExchange {
			owned += " and exchanging seat summaries"
			one.PeerExchange = false
		}
		return fmt.Sprintf("%d replicas%s, streams balanced %s; %s", c.Replicas, owned, c.Balance, one.Describe())
	}
	if c.RequestBodyMode != "" {
		plain := c
		plain.RequestBodyMode = ""
		return plain.Describe() + "; request body " + c.RequestBodyMode
	}
	if c.ResponseObserver {
		plain := c
		plain.ResponseObserver = false
		return plain.Describe() + "; responses through an observer stream"
	}
	profile := "upstream v1.5.0 default profile"
	if c.SluiceAdmission {
		profile = "Sluice default profile"
	}
	if c.EndpointPickerConfigSource != "" {
		profile = "profile " + c.EndpointPickerConfigSource
	}
	switch {
	case !c.SluiceAdmission:
		return "EPP, " + profile + ", upstream admission"
	case c.FlowControlPolicySource != "":
		return "EPP, " + profile + ", Sluice admission with " + c.FlowControlPolicySource
	default:
		return "EPP, " + profile + ", Sluice admission (default policy)"
	}
}

// Contender returns the named contender.
func (s *Scenario) Contender(name string) (Contender, bool) {
	i := slices.IndexFunc(s.Contenders, func(c Contender) bool { return c.Name == name })
	if i < 0 {
		return Contender{}, false
	}
	return s.Contenders[i], true
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// LoadScenario reads and validates a scenario file, reporting every problem
// at once, each naming its field.
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc, err := ParseScenario(data, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// LoadScenarios loads every <dir>/*/scenario.yaml, sorted by order then
// name, each followed by its shapes. It fails on the first invalid file and
// when two scenarios share a name.
func LoadScenarios(dir string) ([]*Scenario, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*", ScenarioFileName))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no scenarios: no %s in the folders of %s", ScenarioFileName, dir)
	}
	var out []*Scenario
	seen := map[string]string{}
	for _, p := range paths {
		sc, err := LoadScenario(p)
		if err != nil {
			return nil, err
		}
		for _, x := range append([]*Scenario{sc}, sc.Shapes...) {
			if prev, ok := seen[x.Name]; ok {
				return nil, fmt.Errorf("scenario name %q is used by %s and %s", x.Name, prev, p)
			}
			seen[x.Name] = p
			out = append(out, x)
		}
	}
	// A file's shapes stay together, in the file's order.
	slices.SortStableFunc(out, func(a, b *Scenario) int {
		if a.Order != b.Order {
			return a.Order - b.Order
		}
		return strings.Compare(a.Family, b.Family)
	})
	return out, nil
}

// ParseScenario parses a scenario file's content; dir is where its relative
// paths point (and its default name).
func ParseScenario(data []byte, dir string) (*Scenario, error) {
	var f ScenarioFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("parsing scenario: %w", err)
	}
	sc, err := f.build(dir)
	if err != nil {
		return nil, fmt.Errorf("invalid scenario: %w", err)
	}
	var errs []error
	for i, shape := range f.Shapes {
		x, err := f.shape(shape, sc).build(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("shapes[%d] (%s): %w", i, shape.Name, err))
			continue
		}
		x.Family = sc.Name
		sc.Shapes = append(sc.Shapes, x)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid scenario: %w", errors.Join(errs...))
	}
	return sc, nil
}

// shape is the scenario file of one of f's shapes; base is f's scenario.
func (f *ScenarioFile) shape(shape ShapeFile, base *Scenario) *ScenarioFile {
	g := *f
	g.Name, g.Shape, g.Shapes = base.Name+"-"+shape.Name, shape.Name, nil
	g.Title = base.Title + " · " + shape.Name
	if shape.Description != "" {
		g.Description = shape.Description
	}
	g.Fleet, g.Capacity, g.ExtraContenders = shape.Fleet, shape.Capacity, shape.ExtraContenders
	if shape.OutputLength != "" {
		g.OutputLength = shape.OutputLength
	}
	if shape.Arrival != nil {
		g.Arrival = *shape.Arrival
	}
	if f.Unloaded != nil {
		g.Unloaded = &UnloadedFile{Class: f.Unloaded.Class, Rate: shape.UnloadedRate}
	}
	return &g
}

// fieldErrors collects problems, each prefixed with the field it is about.
type fieldErrors []error

func (e *fieldErrors) add(field string, err error) {
	*e = append(*e, fmt.Errorf("%s: %w", field, err))
}

func (e *fieldErrors) addf(field, format string, args ...any) {
	e.add(field, fmt.Errorf(format, args...))
}

// duration parses an optional non-negative duration string ("" is 0).
func (e *fieldErrors) duration(field, s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		e.addf(field, "want a duration such as \"30s\", got %q", s)
	case d < 0:
		e.addf(field, "must not be negative, got %q", s)
	}
	return d
}

// build applies defaults, reads the files f names and validates everything.
func (f *ScenarioFile) build(dir string) (*Scenario, error) {
	var errs fieldErrors
	sc := &Scenario{
		Name: f.Name, Order: f.Order, Title: f.Title, Description: f.Description, Dir: dir, Shape: f.Shape,
		Fleet: f.Fleet, Duration: errs.duration("duration", f.Duration), Drain: errs.duration("drain", f.Drain),
		SLO: loadgen.SLO{
			TTFT: loadgen.Duration(errs.duration("slo.ttft", f.SLO.TTFT)),
			ITL:  loadgen.Duration(errs.duration("slo.itl", f.SLO.ITL)),
			E2E:  loadgen.Duration(errs.duration("slo.e2e", f.SLO.E2E)),
		},
		Seed: DefaultSeed,
	}
	if sc.Name == "" && dir != "" {
		sc.Name = filepath.Base(dir)
	}
	if !namePattern.MatchString(sc.Name) {
		errs.addf("name", "%q must be 1-63 lowercase letters, digits or dashes, starting with a letter or digit", sc.Name)
	}
	if sc.Title == "" {
		sc.Title = sc.Name
	}
	sc.Family = sc.Name
	if f.Shape != "" && !namePattern.MatchString(f.Shape) {
		errs.addf("shape", "%q must be 1-63 lowercase letters, digits or dashes", f.Shape)
	}
	seenShapes := map[string]bool{f.Shape: true}
	for i, shape := range f.Shapes {
		if !namePattern.MatchString(shape.Name) || seenShapes[shape.Name] {
			errs.addf(fmt.Sprintf("shapes[%d].name", i), "%q must be unique and 1-63 lowercase letters, digits or dashes", shape.Name)
		}
		seenShapes[shape.Name] = true
	}
	if len(f.Shapes) > 0 && f.Shape == "" {
		errs.add("shape", errors.New("required with shapes: the name of this fleet's shape, for the report"))
	}
	if math.IsNaN(f.Capacity) || math.IsInf(f.Capacity, 0) || f.Capacity < 0 {
		errs.addf("capacity", "must be a non-negative number of requests per second, got %v", f.Capacity)
	}
	sc.Capacity = f.Capacity
	if f.Seed != nil {
		sc.Seed = *f.Seed
	}
	sc.Interleave = f.Interleave
	if f.OutputLength != "" {
		l, err := simulator.ParseOutputLength(f.OutputLength)
		if err != nil {
			errs.add("output_length", err)
		}
		sc.OutputLength = l
	}

	if f.Fleet == "" {
		errs.add("fleet", errors.New("required, e.g. h100:2,a10g:2"))
	} else if entries, err := engine.ParseFleet(f.Fleet); err != nil {
		errs.add("fleet", err)
	} else {
		for _, e := range entries {
			sc.FleetSize += e.Count
		}
	}

	f.buildMix(sc, dir, &errs)
	f.buildArrival(sc, &errs)

	if sc.Duration == 0 {
		sc.Duration = DefaultDuration
	}
	if sc.Duration > maxDuration {
		errs.addf("duration", "%v exceeds the limit of %v", sc.Duration, maxDuration)
	}
	if sc.Drain == 0 {
		sc.Drain = DefaultDrain
	}
	if sc.Drain > maxDuration {
		errs.addf("drain", "%v exceeds the limit of %v", sc.Drain, maxDuration)
	}
	if f.Retry != nil {
		sc.Retry = loadgen.RetryPolicy{MaxAttempts: f.Retry.MaxAttempts, MaxWait: errs.duration("retry.max_wait", f.Retry.MaxWait)}
		if f.Retry.MaxAttempts < 1 {
			errs.addf("retry.max_attempts", "must be at least 1 (1 = never retry), got %d", f.Retry.MaxAttempts)
		}
	}
	if f.Objectives != "" {
		sc.ObjectivesSource = f.Objectives
		b, err := readRelative(dir, f.Objectives)
		if err != nil {
			errs.add("objectives", err)
		}
		sc.Objectives = b
	}

	f.buildUnloaded(sc, &errs)
	f.buildContenders(sc, dir, &errs)
	f.buildTargets(sc, &errs)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return sc, nil
}

func (f *ScenarioFile) buildMix(sc *Scenario, dir string, errs *fieldErrors) {
	raw := bytes.TrimSpace(f.Mix)
	var data []byte
	switch {
	case len(raw) == 0 || string(raw) == "null":
		errs.add("mix", errors.New("required: a mix file path or an inline mix"))
		return
	case raw[0] == '"':
		var path string
		if err := json.Unmarshal(raw, &path); err != nil {
			errs.add("mix", err)
			return
		}
		b, err := readRelative(dir, path)
		if err != nil {
			errs.add("mix", err)
			return
		}
		data, sc.MixSource = b, path
	case raw[0] == '{':
		data, sc.MixSource = raw, "inline"
	default:
		errs.add("mix", errors.New("want a file path or an inline mix"))
		return
	}
	mix, err := loadgen.ParseMix(data)
	if err != nil {
		errs.add("mix", err)
		return
	}
	if f.Interleave {
		// Requests are dealt one by one: a chat's turns would go to different contenders, each seeing a history it
		// never served.
		for _, c := range mix.Classes {
			if c.MultiTurn != nil {
				errs.addf("interleave", "class %q has multi_turn: an interleaved run deals each request on its own, so a chat's turns would reach different contenders", c.Name)
			}
		}
	}
	if f.Adapters != nil {
		adapters, ok := f.Adapters.expand(mix, errs)
		if !ok {
			return
		}
		sc.Adapters = adapters
	}
	// vllm-sim serves one base model per fleet: every class must ask for it.
	models := map[string]bool{}
	for _, c := range mix.Classes {
		models[c.Model] = true
	}
	if len(models) != 1 {
		errs.addf("mix", "the classes use %d base models; a simulated fleet serves exactly one", len(models))
		return
	}
	sc.Model = mix.Classes[0].Model
	sc.Mix = mix
}

func (f *ScenarioFile) buildArrival(sc *Scenario, errs *fieldErrors) {
	a := f.Arrival
	sc.Arrival = loadgen.ArrivalConfig{
		Kind: loadgen.ArrivalKind(a.Kind), Rate: a.Rate,
		BurstOn: errs.duration("arrival.burst_on", a.BurstOn), BurstOff: errs.duration("arrival.burst_off", a.BurstOff),
	}
	for i, p := range a.Phases {
		sc.Arrival.Phases = append(sc.Arrival.Phases,
			loadgen.Phase{Rate: p.Rate, Duration: errs.duration(fmt.Sprintf("arrival.phases[%d].duration", i), p.Duration)})
	}
	switch sc.Arrival.Kind {
	case loadgen.ArrivalPoisson, loadgen.ArrivalConstant:
		if a.BurstOn != "" || a.BurstOff != "" {
			errs.addf("arrival", "burst_on and burst_off apply to bursty arrivals only, not %q", a.Kind)
		}
	case loadgen.ArrivalBursty:
		if sc.Arrival.BurstOn <= 0 {
			errs.add("arrival.burst_on", errors.New("bursty arrivals need a positive ON window, e.g. 4s"))
		}
	case loadgen.ArrivalPhased:
		if err := sc.Arrival.Validate(); err != nil {
			errs.add("arrival.phases", err)
		}
		return
	case "":
		errs.add("arrival.kind", errors.New("required: poisson, constant, bursty or phased"))
	default:
		errs.addf("arrival.kind", "%q is not poisson, constant, bursty or phased", a.Kind)
	}
	if len(a.Phases) > 0 {
		errs.addf("arrival.phases", "phases apply to phased arrivals only, not %q", a.Kind)
	}
	if math.IsNaN(a.Rate) || math.IsInf(a.Rate, 0) || a.Rate <= 0 {
		errs.addf("arrival.rate", "must be a positive number of requests per second, got %v", a.Rate)
	}
}

// buildUnloaded validates the unloaded reference; it needs the mix.
func (f *ScenarioFile) buildUnloaded(sc *Scenario, errs *fieldErrors) {
	u := f.Unloaded
	if u == nil {
		return
	}
	if sc.Mix != nil && !slices.ContainsFunc(sc.Mix.Classes, func(c loadgen.Class) bool { return c.Name == u.Class }) {
		errs.addf("unloaded.class", "the mix has no class %q", u.Class)
	}
	if math.IsNaN(u.Rate) || math.IsInf(u.Rate, 0) || u.Rate <= 0 {
		errs.addf("unloaded.rate", "must be a positive number of requests per second (a shape's unloaded_rate), got %v", u.Rate)
	}
	sc.Unloaded = &UnloadedReference{Class: u.Class, Rate: u.Rate}
}

func (f *ScenarioFile) buildContenders(sc *Scenario, dir string, errs *fieldErrors) {
	sc.Contenders = []Contender{
		{Name: RoundRobin, Router: RouterRoundRobin},
		{Name: UpstreamDefault, Router: RouterEPP},
	}
	reserved := map[string]bool{RoundRobin: true, UpstreamDefault: true, Sluice: true, Unloaded: true}
	for i, x := range f.ExtraContenders {
		field := fmt.Sprintf("extra_contenders[%d]", i)
		switch {
		case !namePattern.MatchString(x.Name):
			errs.addf(field+".name", "%q must be 1-63 lowercase letters, digits or dashes", x.Name)
		case reserved[x.Name]:
			errs.addf(field+".name", "%q is taken (by a built-in contender or an earlier extra)", x.Name)
		}
		reserved[x.Name] = true
		c := Contender{Name: x.Name, Router: x.Router, SluiceAdmission: x.SluiceAdmission, Extra: true,
			RequestBodyMode: x.RequestBodyMode, ResponseObserver: x.ResponseObserver}
		switch dataplane.BodyMode(x.RequestBodyMode) {
		case "", dataplane.BodyFullDuplexStreamed, dataplane.BodyBuffered:
		default:
			errs.addf(field+".request_body_mode", "%q is not %s or %s", x.RequestBodyMode, dataplane.BodyFullDuplexStreamed, dataplane.BodyBuffered)
		}
		switch x.Router {
		case RouterEPP:
			loadEPPFiles(&c, dir, x.EPPConfig, x.FlowControlPolicy, field, errs)
		case RouterRoundRobin:
			if x.EPPConfig != "" || x.FlowControlPolicy != "" || x.SluiceAdmission || x.RequestBodyMode != "" || x.ResponseObserver {
				errs.add(field, errors.New("a round-robin contender has no EPP: drop epp_config, flow_control_policy, sluice_admission, request_body_mode and response_observer"))
			}
		default:
			errs.addf(field+".router", "%q is not epp or round-robin", x.Router)
		}
		sc.Contenders = append(sc.Contenders, c)
	}
	sluice := Contender{Name: Sluice, Router: RouterEPP, SluiceAdmission: true}
	if f.Sluice != nil {
		loadEPPFiles(&sluice, dir, f.Sluice.EPPConfig, f.Sluice.FlowControlPolicy, "sluice", errs)
	}
	sc.Contenders = append(sc.Contenders, sluice)
	sc.Contenders = append(sc.Contenders, f.Replicas.contenders(sluice, errs)...)
	if sc.Unloaded != nil {
		ref := sluice
		ref.Name, ref.Unloaded = Unloaded, true
		sc.Contenders = append(sc.Contenders, ref)
	}
}

// loadEPPFiles reads a contender's EPP configuration and policy files.
func loadEPPFiles(c *Contender, dir, config, policy, field string, errs *fieldErrors) {
	if config != "" {
		b, err := readRelative(dir, config)
		if err != nil {
			errs.add(field+".epp_config", err)
		}
		c.EndpointPickerConfig, c.EndpointPickerConfigSource = b, config
	}
	if policy != "" {
		b, err := readRelative(dir, policy)
		if err != nil {
			errs.add(field+".flow_control_policy", err)
		}
		c.FlowControlPolicy, c.FlowControlPolicySource = b, policy
		c.SluiceAdmission = true // as --flow-control-config does
	}
}

func (f *ScenarioFile) buildTargets(sc *Scenario, errs *fieldErrors) {
	for i, t := range f.Targets {
		field := fmt.Sprintf("targets[%d]", i)
		if target, ok := t.build(errs, field, sc); ok {
			sc.Targets = append(sc.Targets, target)
		}
	}
	sc.Targets = append(sc.Targets, f.Replicas.targets(sc, errs)...)
	sc.Targets = append(sc.Targets, Target{
		Figure: FigureEvery, Versus: UpstreamDefault, Kind: Within, Bound: NoWorseTolerance, Implicit: true,
	})
}

// build validates the target against the scenario (its classes and
// unloaded reference), reporting problems under field; ok is false when
// there were any.
func (t TargetFile) build(errs *fieldErrors, field string, sc *Scenario) (target Target, ok bool) {
	before := len(*errs)
	fig := Figure(t.Figure)
	count := slices.Contains(CountFigures, fig)
	if fig != FigureEvery && !count && fig != FigurePrefixHitRate && !slices.Contains(Figures, fig) {
		errs.addf(field+".figure", "%q is not one of %v, %v, %q or %q", t.Figure, Figures, CountFigures, FigurePrefixHitRate, FigureEvery)
	}
	if fig == FigurePrefixHitRate && (t.Class != "" || t.Vs == "" || t.Vs == Unloaded) {
		errs.addf(field, "figure %q is the fleet's: compare it with a contender's, over all classes", fig)
	}
	switch t.Vs {
	case RoundRobin, UpstreamDefault:
	case Unloaded:
		switch {
		case sc.Unloaded == nil:
			errs.add(field+".vs", errors.New("unloaded needs the scenario's unloaded reference"))
		case t.Class == "":
			t.Class = sc.Unloaded.Class
		case t.Class != sc.Unloaded.Class:
			errs.addf(field+".class", "%q is not the unloaded reference's class %q", t.Class, sc.Unloaded.Class)
		}
	case "":
	default:
		errs.addf(field+".vs", "%q is not %s, %s, %s or empty (a value, not a ratio)", t.Vs, RoundRobin, UpstreamDefault, Unloaded)
	}
	if count && t.Vs != "" {
		errs.addf(field+".vs", "figure %q is a count or a share: judge its value (no vs)", t.Figure)
	}
	if (fig == FigureEvery || t.Within != nil) && (t.Vs == "" || t.Vs == Unloaded) {
		errs.addf(field, "figure %q and within compare Sluice with a contender (vs: %s or %s)", t.Figure, RoundRobin, UpstreamDefault)
	}
	if t.Class != "" && sc.Mix != nil && !slices.ContainsFunc(sc.Mix.Classes, func(c loadgen.Class) bool { return c.Name == t.Class }) {
		errs.addf(field+".class", "the mix has no class %q", t.Class)
	}
	target = Target{Figure: fig, Class: t.Class, Versus: t.Vs}
	n := 0
	for _, b := range []struct {
		kind  TargetKind
		bound *float64
	}{{AtMost, t.AtMost}, {AtLeast, t.AtLeast}, {Within, t.Within}} {
		if b.bound == nil {
			continue
		}
		n++
		target.Kind, target.Bound = b.kind, *b.bound
		if math.IsNaN(*b.bound) || math.IsInf(*b.bound, 0) || *b.bound < 0 {
			errs.addf(field+"."+string(b.kind), "must be a finite number >= 0, got %v", *b.bound)
		}
	}
	if n != 1 {
		errs.addf(field, "give exactly one of %s, %s and %s", AtMost, AtLeast, Within)
	}
	if fig == FigureEvery && n == 1 && target.Kind != Within {
		errs.addf(field, "figure %q takes %s (the figures point different ways)", FigureEvery, Within)
	}
	return target, len(*errs) == before
}

// expand turns the template class into base and adapter classes and returns
// the adapter names; ok is false when it reported problems.
func (a *AdaptersFile) expand(mix *loadgen.Mix, errs *fieldErrors) (names []string, ok bool) {
	before := len(*errs)
	if a.Count < 1 || a.Count > maxAdapters {
		errs.addf("adapters.count", "must be 1..%d, got %d", maxAdapters, a.Count)
	}
	if math.IsNaN(a.ZipfS) || math.IsInf(a.ZipfS, 0) || a.ZipfS < 0 {
		errs.addf("adapters.zipf_s", "must be a finite number >= 0, got %v", a.ZipfS)
	}
	if math.IsNaN(a.Share) || a.Share <= 0 || a.Share > 1 {
		errs.addf("adapters.share", "must be in (0, 1], got %v", a.Share)
	}
	ti := -1
	switch {
	case a.Class != "":
		ti = slices.IndexFunc(mix.Classes, func(c loadgen.Class) bool { return c.Name == a.Class })
		if ti < 0 {
			errs.addf("adapters.class", "the mix has no class %q", a.Class)
		}
	case len(mix.Classes) == 1:
		ti = 0
	default:
		errs.addf("adapters.class", "required when the mix has %d classes", len(mix.Classes))
	}
	if ti >= 0 && mix.Classes[ti].LoRA != "" {
		errs.addf("adapters.class", "%q already names LoRA %q", mix.Classes[ti].Name, mix.Classes[ti].LoRA)
	}
	if len(*errs) > before {
		return nil, false
	}

	template := mix.Classes[ti]
	weight := *template.Weight
	var norm float64
	for k := 1; k <= a.Count; k++ {
		norm += math.Pow(float64(k), -a.ZipfS)
	}
	names = make([]string, a.Count)
	classes := slices.Clone(mix.Classes[:ti])
	if a.Share < 1 {
		base := template
		base.Weight = ptr(weight * (1 - a.Share))
		classes = append(classes, base)
	}
	width := len(fmt.Sprint(a.Count - 1))
	width = max(width, 2)
	for k := 1; k <= a.Count; k++ {
		c := template
		names[k-1] = fmt.Sprintf("adapter-%0*d", width, k-1)
		c.Name = template.Name + "/" + names[k-1]
		c.LoRA = names[k-1]
		c.Weight = ptr(weight * a.Share * math.Pow(float64(k), -a.ZipfS) / norm)
		classes = append(classes, c)
	}
	classes = append(classes, mix.Classes[ti+1:]...)
	mix.Classes = classes
	if err := mix.Validate(); err != nil {
		errs.add("adapters", err)
		return nil, false
	}
	return names, true
}

func ptr[T any](v T) *T { return &v }

// readRelative reads path, relative to dir unless absolute.
func readRelative(dir, path string) ([]byte, error) {
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	return os.ReadFile(path)
}
