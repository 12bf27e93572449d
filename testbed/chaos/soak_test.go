package chaos

import (
	"flag"
	"path/filepath"
	"testing"
	"time"
)

var soak = flag.Duration("chaos.soak", 0, "run the soak (make soak) with an overload of this length; 0 skips it")

// TestSoak runs the soak when -chaos.soak is set: Factor times the fleet's
// capacity for the given time, then the checks of SoakResult.Failures.
// `make test` skips it.
func TestSoak(t *testing.T) {
	if *soak == 0 {
		t.Skip("the soak runs with -chaos.soak=DURATION (make soak)")
	}
	dir := *out
	if dir == "" {
		dir = t.TempDir()
	}
	base := StackOptions{Bin: Binaries(t), Dir: filepath.Join(dir, "logs"), Servers: 3, ServerArgs: serverArgs}
	start := time.Now()
	res := Soak(t, base, DefaultSoakOptions(*soak))
	t.Logf("soak took %v\n%s", time.Since(start).Round(time.Second), SoakSummary(res))
	if err := WriteSoakOutputs(dir, res); err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Failures() {
		t.Error(f)
	}
}
