package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `usage:
  image base     --cache DIR [--ca-bundle FILE] [--repo NAME]
  image finalize --in KO_TARBALL --out TARBALL --tag REPO:TAG --version V --revision SHA [--source URL]

Run "image <subcommand> -h" for the flags of a subcommand.
`

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "hack/image: %v\n", err)
		}
		os.Exit(2)
	}
}

// run dispatches to a subcommand; stdout carries only machine-readable
// results (the base reference), diagnostics go to stderr.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing subcommand")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "base":
		return runBase(rest, stdout, stderr)
	case "finalize":
		return runFinalize(rest, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown subcommand %q", cmd)
	}
}

// newFlagSet returns a flag set that reports errors instead of exiting, so
// run stays testable and every failure goes through one exit path.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// requireFlags returns an error naming every flag in names left empty.
func requireFlags(fs *flag.FlagSet, names ...string) error {
	var errs []error
	for _, n := range names {
		if fs.Lookup(n).Value.String() == "" {
			errs = append(errs, fmt.Errorf("%s: --%s is required", fs.Name(), n))
		}
	}
	return errors.Join(errs...)
}
