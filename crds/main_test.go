package crds

import (
	"os"
	"testing"

	"github.com/sluice-gw/sluice/crds/internal/apitest"
)

func TestMain(m *testing.M) {
	os.Exit(apitest.Main(m, "manifests"))
}
