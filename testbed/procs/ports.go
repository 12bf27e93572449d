package procs

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
)

// Where FreePortRange looks: above the usual service ports, below Linux's
// default ephemeral range (32768-60999), so the load's own connections do
// not take a port between the check and the bind.
const (
	portRangeLow  = 20000
	portRangeHigh = 32000
)

// FreePortRange returns the first of n consecutive ports that were free on
// every one of hosts (IP addresses) a moment ago: vllm-sim --fleet numbers
// its servers from a base port, and servers on distinct loopback addresses
// (127.0.0.2, 127.0.0.3, ...) share one port as pods of a pool do.
func FreePortRange(n int, hosts ...string) (int, error) {
	if len(hosts) == 0 {
		return 0, errors.New("no host to look for free ports on")
	}
	for range 100 {
		base := portRangeLow + rand.IntN(portRangeHigh-portRangeLow-n)
		if portsFree(base, n, hosts) {
			return base, nil
		}
	}
	return 0, errors.New("no block of free ports found")
}

func portsFree(base, n int, hosts []string) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		for _, h := range hosts {
			l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(p)))
			if err != nil {
				return false
			}
			ls = append(ls, l)
		}
	}
	return true
}
