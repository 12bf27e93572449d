package runner

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
)

// nonDefault returns a valid value for f that differs from its default.
func nonDefault(t *testing.T, f *pflag.Flag) string {
	t.Helper()
	switch f.Value.Type() {
	case "bool":
		if f.DefValue == "true" {
			return "false"
		}
		return "true"
	case "int", "int8", "int32", "int64", "count":
		return "4321"
	case "duration":
		return "7s"
	case "intSlice":
		return "3000,3001"
	case "stringSlice":
		return "127.0.0.1:8001,127.0.0.1:8002"
	case "string":
		switch f.Name {
		case "model-server-metrics-scheme":
			return "https"
		case "zap-encoder":
			return "json"
		case "zap-log-level", "zap-stacktrace-level":
			return "error"
		case "zap-time-encoding":
			return "rfc3339"
		}
		return "value-" + f.Name
	case "level", "encoder", "time-encoding":
		switch f.Name {
		case "zap-encoder":
			return "json"
		case "zap-time-encoding":
			return "rfc3339"
		}
		return "error"
	}
	t.Fatalf("flag --%s has type %q the test does not know", f.Name, f.Value.Type())
	return ""
}

// TestEveryUpstreamFlagParses checks, flag by flag, that every flag upstream's
// v1.5.0 EPP defines exists with the same default and parses a non-default
// value.
func TestEveryUpstreamFlagParses(t *testing.T) {
	upstream := pflag.NewFlagSet("upstream", pflag.ContinueOnError)
	runserver.NewOptions().AddFlags(upstream)
	count := 0
	upstream.VisitAll(func(uf *pflag.Flag) {
		count++
		t.Run(uf.Name, func(t *testing.T) {
			fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
			NewOptions().AddFlags(fs)
			f := fs.Lookup(uf.Name)
			if f == nil {
				t.Fatalf("flag --%s missing", uf.Name)
			}
			if f.DefValue != uf.DefValue {
				t.Errorf("--%s default = %q, upstream %q", uf.Name, f.DefValue, uf.DefValue)
			}
			if f.Shorthand != uf.Shorthand || (f.Deprecated == "") != (uf.Deprecated == "") || f.Hidden != uf.Hidden {
				t.Errorf("--%s shape differs from upstream", uf.Name)
			}
			v := nonDefault(t, f)
			if err := fs.Parse([]string{"--" + uf.Name + "=" + v}); err != nil {
				t.Fatalf("--%s=%s: %v", uf.Name, v, err)
			}
			if !f.Changed || f.Value.String() == f.DefValue {
				t.Errorf("--%s=%s did not take effect (value %q)", uf.Name, v, f.Value.String())
			}
		})
	})
	if count < 30 {
		t.Fatalf("upstream defines only %d flags; the comparison is not looking at the right flag set", count)
	}
}

// TestFlagsReachOptions checks that named flags land in the right fields.
func TestFlagsReachOptions(t *testing.T) {
	tests := []struct {
		args  []string
		check func(o *Options) bool
	}{
		{[]string{"--pool-name=p"}, func(o *Options) bool { return o.PoolName == "p" }},
		{[]string{"--pool-namespace=ns"}, func(o *Options) bool { return o.PoolNamespace == "ns" }},
		{[]string{"--pool-group=g"}, func(o *Options) bool { return o.PoolGroup == "g" }},
		{[]string{"--endpoint-selector=app=vllm"}, func(o *Options) bool { return o.EndpointSelector == "app=vllm" }},
		{[]string{"--endpoint-target-ports=8000,8001"}, func(o *Options) bool { return len(o.EndpointTargetPorts) == 2 }},
		{[]string{"--grpc-port=1"}, func(o *Options) bool { return o.GRPCPort == 1 }},
		{[]string{"--grpc-health-port=2"}, func(o *Options) bool { return o.GRPCHealthPort == 2 }},
		{[]string{"--metrics-port=3"}, func(o *Options) bool { return o.MetricsPort == 3 }},
		{[]string{"--config-file=/x"}, func(o *Options) bool { return o.ConfigFile == "/x" }},
		{[]string{"--config-text=y"}, func(o *Options) bool { return o.ConfigText == "y" }},
		{[]string{"--secure-serving=false"}, func(o *Options) bool { return !o.SecureServing }},
		{[]string{"--cert-path=/c"}, func(o *Options) bool { return o.CertPath == "/c" }},
		{[]string{"--enable-cert-reload"}, func(o *Options) bool { return o.EnableCertReload }},
		{[]string{"--metrics-endpoint-auth=false"}, func(o *Options) bool { return !o.MetricsEndpointAuth }},
		{[]string{"--ha-enable-leader-election"}, func(o *Options) bool { return o.EnableLeaderElection }},
		{[]string{"--refresh-metrics-interval=1s"}, func(o *Options) bool { return o.RefreshMetricsInterval == time.Second }},
		{[]string{"--metrics-staleness-threshold=9s"}, func(o *Options) bool { return o.MetricsStalenessThreshold == 9*time.Second }},
		{[]string{"-v=3"}, func(o *Options) bool { return o.LogVerbosity == 3 }},
		{[]string{"--model-server-metrics-port=9"}, func(o *Options) bool { return o.ModelServerMetricsPort == 9 }},
		{[]string{"--static-endpoints=127.0.0.1:1,127.0.0.1:2"}, func(o *Options) bool { return len(o.StaticEndpoints) == 2 }},
		{[]string{"--static-endpoints-file=/f"}, func(o *Options) bool { return o.StaticEndpointsFile == "/f" }},
		{[]string{"--version"}, func(o *Options) bool { return o.ShowVersion }},
		{[]string{"--decision-trace=7"}, func(o *Options) bool { return o.DecisionTrace == 7 }},
		{[]string{"--decision-trace-header=x-t"}, func(o *Options) bool { return o.DecisionTraceHeader == "x-t" }},
		{[]string{"--decision-trace-rate=2.5"}, func(o *Options) bool { return o.DecisionTraceRate == 2.5 }},
		{[]string{"--peers=a:1,b:1"}, func(o *Options) bool { return o.Peers == "a:1,b:1" }},
		{[]string{"--peers-file=/p"}, func(o *Options) bool { return o.PeersFile == "/p" }},
		{[]string{"--peers-service=epp"}, func(o *Options) bool { return o.PeersService == "epp" }},
		{[]string{"--response-observer-wait=2s"}, func(o *Options) bool { return o.ResponseObserverWait == 2*time.Second }},
		{[]string{"--replica-id=a:1"}, func(o *Options) bool { return o.ReplicaID == "a:1" }},
		{[]string{"--peer-probe-interval=1s"}, func(o *Options) bool { return o.PeerProbeInterval == time.Second }},
		{[]string{"--peer-timeout=3s"}, func(o *Options) bool { return o.PeerTimeout == 3*time.Second }},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
			o := NewOptions()
			o.AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if !tt.check(o) {
				t.Errorf("%v did not reach Options", tt.args)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string // substring; empty means valid
	}{
		{"pool name", []string{"--pool-name=p"}, ""},
		{"nothing", nil, "either pool-name or endpoint-selector must be set"},
		{"static list", []string{"--static-endpoints=127.0.0.1:8001"}, ""},
		{"static file", []string{"--static-endpoints-file=/tmp/x"}, ""},
		{"static and pool", []string{"--static-endpoints=127.0.0.1:8001", "--pool-name=p"}, "cannot be combined with --pool-name or --endpoint-selector"},
		{"static and selector", []string{"--static-endpoints=127.0.0.1:8001", "--endpoint-selector=a=b"}, "cannot be combined"},
		{"static both forms", []string{"--static-endpoints=127.0.0.1:8001", "--static-endpoints-file=/x"}, "not both"},
		{"static leader election", []string{"--static-endpoints=127.0.0.1:8001", "--ha-enable-leader-election"}, "needs a Kubernetes API"},
		{"static explicit metrics auth", []string{"--static-endpoints=127.0.0.1:8001", "--metrics-endpoint-auth=true"}, "cannot be used in static mode"},
		{"static bad endpoint", []string{"--static-endpoints=localhost:8001"}, "must be an IP address"},
		{"static bad port", []string{"--static-endpoints=127.0.0.1:0"}, "from 1 to 65535"},
		{"static upstream checks still run", []string{"--static-endpoints=127.0.0.1:8001", "--config-file=a", "--config-text=b"}, "can not be set at the same time"},
		{"objectives file outside static mode", []string{"--pool-name=p", "--inference-objectives-file=/o.yaml"}, "is for static mode"},
		{"static objectives file", []string{"--static-endpoints=127.0.0.1:8001", "--inference-objectives-file=/o.yaml"}, ""},
		{"static bad reload interval", []string{"--static-endpoints-file=/x", "--static-endpoints-reload-interval=0s"}, "must be positive"},
		{"decision trace", []string{"--pool-name=p", "--decision-trace=100", "--decision-trace-header=x-t", "--decision-trace-rate=0"}, ""},
		{"decision trace negative", []string{"--pool-name=p", "--decision-trace=-1"}, "--decision-trace: decision trace size must be between 1 and"},
		{"decision trace too large", []string{"--pool-name=p", "--decision-trace=10001"}, "--decision-trace: decision trace size"},
		{"decision trace negative rate", []string{"--pool-name=p", "--decision-trace=1", "--decision-trace-rate=-1"}, "decision trace rate"},
		{"decision trace off, a bad rate", []string{"--pool-name=p", "--decision-trace-rate=-1"}, "decision trace rate"},
		{"no label values", []string{"--static-endpoints=10.0.0.1:8000", "--metrics-max-label-values=0"}, "must be at least 1"},
		{"peers", []string{"--static-endpoints=10.0.0.1:8000", "--peers=epp-0:9003,epp-1:9003", "--replica-id=epp-1:9003"}, ""},
		{"peers service", []string{"--pool-name=p", "--peers-service=epp"}, ""},
		{"peers not host:port", []string{"--static-endpoints=10.0.0.1:8000", "--peers=epp-0"}, `--peers: line 1: peer "epp-0" is not host:port`},
		{"peers file missing", []string{"--static-endpoints=10.0.0.1:8000", "--peers-file=/nonexistent/peers"}, "--peers-file: open /nonexistent/peers"},
		{"replica not a peer", []string{"--static-endpoints=10.0.0.1:8000", "--peers=a:1,b:1", "--replica-id=c:1"}, `--replica-id "c:1" is not among the peers`},
		{"two peer sources", []string{"--pool-name=p", "--peers=a:1", "--peers-service=epp"}, "set one of --peers, --peers-file and --peers-service"},
		{"peers service in static mode", []string{"--static-endpoints=10.0.0.1:8000", "--peers-service=epp"}, "cannot be used in static mode"},
		{"peers and leader election", []string{"--pool-name=p", "--peers-service=epp", "--ha-enable-leader-election"}, ""},
		{"peer timeout within interval", []string{"--pool-name=p", "--peers-service=epp", "--peer-probe-interval=100ms", "--peer-timeout=100ms"}, "at least twice --peer-probe-interval"},
		{"peer timeout under two intervals", []string{"--pool-name=p", "--peers-service=epp", "--peer-probe-interval=100ms", "--peer-timeout=150ms"}, "at least twice --peer-probe-interval"},
		{"response observer", []string{"--static-endpoints=10.0.0.1:8000", "--response-observer-wait=2s"}, ""},
		{"response observer wait negative", []string{"--static-endpoints=10.0.0.1:8000", "--response-observer-wait=-1s"}, "must not be negative"},
		{"response observer with peers", []string{"--static-endpoints=10.0.0.1:8000", "--peers=a:1,b:1", "--replica-id=a:1", "--response-observer-wait=2s"}, "does not go with --peers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
			o := NewOptions()
			o.AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestPeersSupersedeLeaderElection: upstream's chart passes --ha-enable-leader-election whenever it runs more than one
// replica; a peer source in Kubernetes mode turns it off (every replica active), and nothing else does.
func TestPeersSupersedeLeaderElection(t *testing.T) {
	for _, tc := range []struct {
		name               string
		args               []string
		wantLeaderElection bool
		wantSuperseded     bool
	}{
		{name: "peers service", args: []string{"--pool-name=p", "--peers-service=epp", "--ha-enable-leader-election"}, wantSuperseded: true},
		{name: "peers list", args: []string{"--pool-name=p", "--peers=a:9003,b:9003", "--replica-id=a:9003", "--ha-enable-leader-election"}, wantSuperseded: true},
		{name: "no peers", args: []string{"--pool-name=p", "--ha-enable-leader-election"}, wantLeaderElection: true},
		{name: "peers, no leader election", args: []string{"--pool-name=p", "--peers-service=epp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
			o := NewOptions()
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			if o.EnableLeaderElection != tc.wantLeaderElection || o.leaderElectionSuperseded != tc.wantSuperseded {
				t.Errorf("leader election %v, superseded %v; want %v, %v", o.EnableLeaderElection, o.leaderElectionSuperseded,
					tc.wantLeaderElection, tc.wantSuperseded)
			}
		})
	}
}

func TestStaticModeDisablesDefaultMetricsAuth(t *testing.T) {
	fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
	o := NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--static-endpoints=127.0.0.1:8001"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.MetricsEndpointAuth {
		t.Fatal("static mode kept metrics endpoint authentication, which needs an API server")
	}
}

func TestEnvironment(t *testing.T) {
	t.Run("NAMESPACE resolves the pool namespace", func(t *testing.T) {
		t.Setenv("NAMESPACE", "from-env")
		if got := poolNamespace(""); got != "from-env" {
			t.Fatalf("got %q", got)
		}
		if got := poolNamespace("flag"); got != "flag" {
			t.Fatalf("flag must win over NAMESPACE, got %q", got)
		}
	})
	t.Run("default namespace", func(t *testing.T) {
		t.Setenv("NAMESPACE", "")
		if got := poolNamespace(""); got != "default" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("POD_NAME names the EPP deployment in selector mode", func(t *testing.T) {
		t.Setenv("POD_NAME", "my-epp-7d9f8b6c5d-x2x9z")
		o := NewOptions()
		o.EndpointSelector = "app=vllm"
		g, err := poolGKNN(o)
		if err != nil {
			t.Fatal(err)
		}
		if g.Name != "my-epp" || g.Kind != "Deployment" {
			t.Fatalf("got %+v", g)
		}
	})
	t.Run("POD_NAME missing in selector mode", func(t *testing.T) {
		t.Setenv("POD_NAME", "")
		o := NewOptions()
		o.EndpointSelector = "app=vllm"
		if _, err := poolGKNN(o); err == nil || !strings.Contains(err.Error(), "POD_NAME") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER enables the flow control gate", func(t *testing.T) {
		t.Setenv(enableExperimentalFlowControlLayer, "true")
		o := NewOptions()
		_, gates, err := loadRawConfig(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		if !gates["flowControl"] {
			t.Fatalf("gates = %v", gates)
		}
	})
}
