package envteststart

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Attempts is how many fresh environments Start tries before it gives up.
const Attempts = 3

// Start starts an Environment made by newEnv and returns it running, with its client configuration. When a start
// fails it stops what that attempt left running and tries again with a new Environment from newEnv, up to Attempts
// times; the error names every attempt's failure.
func Start(newEnv func() *envtest.Environment) (*envtest.Environment, *rest.Config, error) {
	var errs []error
	for attempt := 1; attempt <= Attempts; attempt++ {
		env := newEnv()
		cfg, err := env.Start()
		if err == nil {
			return env, cfg, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
		if stopErr := env.Stop(); stopErr != nil {
			errs = append(errs, fmt.Errorf("stopping attempt %d: %w", attempt, stopErr))
		}
	}
	return nil, nil, errors.Join(errs...)
}
