package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	type server struct {
		port    int
		profile string
		seed    uint64
	}
	tests := []struct {
		name    string
		args    string
		want    []server
		wantErr string
	}{
		{name: "default", args: "", want: []server{{8000, "h100", 0}}},
		{name: "replicas", args: "--port 8001 --replicas 3 --seed 5", want: []server{{8001, "h100", 5}, {8002, "h100", 6}, {8003, "h100", 7}}},
		{name: "ports", args: "--ports 9001-9002,9005 --profile a10g", want: []server{{9001, "a10g", 0}, {9002, "a10g", 1}, {9005, "a10g", 2}}},
		{name: "fleet", args: "--fleet h100:1,a10g:2 --base-port 7001", want: []server{{7001, "h100", 0}, {7002, "a10g", 1}, {7003, "a10g", 2}}},
		{name: "fleet from --port", args: "--fleet a10g:1 --port 7100", want: []server{{7100, "a10g", 0}}},
		{name: "fleet and ports", args: "--fleet h100:1 --ports 1-2", wantErr: "excludes"},
		{name: "ports and replicas", args: "--ports 1-2 --replicas 2", wantErr: "excludes"},
		{name: "unknown profile", args: "--profile tpu", wantErr: "unknown hardware profile"},
		{name: "bad fleet count", args: "--fleet h100:0", wantErr: "positive"},
		{name: "bad fleet entry", args: "--fleet h100", wantErr: "profile:count"},
		{name: "bad range", args: "--ports 9005-9001", wantErr: "empty range"},
		{name: "duplicate port", args: "--ports 9001,9001", wantErr: "twice"},
		{name: "port out of range", args: "--port 65535 --replicas 2", wantErr: "out of range"},
		{name: "fleet models without fleet", args: "--fleet-models a,b", wantErr: "needs --fleet"},
		{name: "fleet models count", args: "--fleet h100:1,a10g:1 --fleet-models a", wantErr: "1 models for 2"},
		{name: "bad lora module", args: "--lora-modules sql", wantErr: "name=path"},
		{name: "stray argument", args: "serve", wantErr: "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs, _, err := plan(strings.Fields(tt.args), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []server
			for _, s := range specs {
				got = append(got, server{s.port, s.profile, s.opts.Seed})
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("servers %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPlanOverridesAndOptions(t *testing.T) {
	args := "--fleet h100:1,a10g:1 --max-num-seqs 7 --lora-load-time 1s --no-enable-prefix-caching " +
		"--lora-modules sql=/l/sql,chat=/l/chat --preload-loras sql --fault-error-rate 0.5 --model m"
	specs, _, err := plan(strings.Fields(args), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		c := s.opts.Engine
		if c.MaxNumSeqs != 7 || c.LoRALoadTime != time.Second || !c.DisablePrefixCaching {
			t.Errorf("%s: overrides not applied: %+v", s.profile, c)
		}
		if s.opts.Model != "m" || len(s.opts.LoRAModules) != 2 || s.opts.PreloadLoRAs[0] != "sql" || s.opts.Faults.ErrorRate != 0.5 {
			t.Errorf("%s: options %+v", s.profile, s.opts)
		}
	}
	// Unset engine flags keep each profile's own value.
	if specs[0].opts.Engine.NumGPUBlocks == specs[1].opts.Engine.NumGPUBlocks {
		t.Error("profiles lost their KV sizes")
	}
}

func TestPlanFleetModels(t *testing.T) {
	specs, _, err := plan(strings.Fields("--fleet h100:2,a10g:1,h100:1 --fleet-models stable,canary, --model base"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range specs {
		got = append(got, s.opts.Model)
	}
	if want := "stable stable canary base"; strings.Join(got, " ") != want {
		t.Fatalf("models %v, want %s (an empty entry takes --model)", got, want)
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	_, _, err := plan([]string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"h100", "a10g", "--fleet", "-fault-error-rate", "num-gpu-blocks="} {
		if !strings.Contains(out.String(), strings.TrimPrefix(want, "-")) {
			t.Errorf("help lacks %s", want)
		}
	}
}
