package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// TestCompare reads two --out files back and prints them side by side.
func TestCompare(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, status int) string {
		rec := loadgen.Record{Seq: 0, Attempt: 1, Final: true, Class: "critical", Status: status, TTFT: 120 * time.Millisecond}
		res := &loadgen.Result{Summary: loadgen.Summarize([]loadgen.Record{rec}, loadgen.SummaryOptions{Duration: time.Second}), Records: []loadgen.Record{rec}}
		path := filepath.Join(dir, name+".json")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := loadgen.WriteJSON(f, res); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var out, errOut strings.Builder
	if err := run([]string{"compare", "sluice=" + write("sluice", 200), "round-robin=" + write("rr", 200)}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "round-robin") || !strings.Contains(out.String(), "120 ms") || strings.Count(out.String(), "1/1") != 4 {
		t.Fatalf("compare printed\n%s", out.String())
	}
	for _, bad := range [][]string{{"compare"}, {"compare", "sluice"}, {"compare", "x=" + filepath.Join(dir, "missing.json")}} {
		if err := run(bad, &out, &errOut); err == nil {
			t.Errorf("run(%q) succeeded", bad)
		}
	}
}
