package virtualbench

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func TestZZCalibrate(t *testing.T) {
	mix, _ := loadgen.ParseMix([]byte(`{"api":"chat","stream":true,"classes":[{"name":"chat","model":"meta-llama/Llama-3.1-8B-Instruct","prompt_tokens":512,"output_tokens":128}]}`))
	for _, f := range strings.Split(os.Getenv("CAL_FLEETS"), ";") {
		for _, rate := range []float64{50, 100, 200} {
			for _, rt := range []Router{RoundRobinRouter(), UpstreamRouter()} {
				res, err := Run(Config{Fleet: f, Mix: mix, Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: rate},
					Duration: 60 * time.Second, Seed: 11, Router: rt, Drain: time.Second, SampleInterval: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				done := 0
				for _, s := range res.Samples {
					if s.At > 20*time.Second && s.At <= 60*time.Second {
						done += s.Completed
					}
				}
				fmt.Printf("%-30s %-12s offered %5.1f served %5.2f req/s\n", f, rt.Kind, rate, float64(done)/40)
			}
		}
	}
}
