package replication

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
)

// Membership is what one replica knows of the others: a static peer list (the --peers flag or file; in Kubernetes
// the EPP Service's endpoints) and when each peer was last heard from. A peer is live while it was heard within the
// timeout; a peer never heard is not live, so a replica starts alone and decides alone until its peers speak.
type Membership struct {
	self      string
	peers     []string
	timeout   time.Duration
	lastHeard map[string]time.Time
}

// NewMembership returns self's view of peers (self may be among them; it is always live). timeout is how long a
// silent peer stays live: a few peer message periods, and at most one metrics staleness window, so a dead replica's
// endpoints are taken over within one.
func NewMembership(self string, peers []string, timeout time.Duration) (*Membership, error) {
	var errs []error
	if self == "" {
		errs = append(errs, errors.New("self: the replica's own name is required"))
	}
	if timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout must be positive, got %v", timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m := &Membership{self: self, timeout: timeout, lastHeard: map[string]time.Time{}}
	m.SetPeers(peers)
	return m, nil
}

// SetPeers replaces the peer list (a peers file re-read, the EPP Service's endpoints changed). A peer kept keeps
// when it was last heard; a peer dropped is forgotten, so if it comes back it is live only once heard again.
func (m *Membership) SetPeers(peers []string) {
	m.peers = m.peers[:0]
	for _, p := range sortedUnique(peers) {
		if p != m.self {
			m.peers = append(m.peers, p)
		}
	}
	for p := range m.lastHeard {
		if !slices.Contains(m.peers, p) {
			delete(m.lastHeard, p)
		}
	}
}

// Heard records a message from peer at now; peers outside the list are ignored (a stray or misconfigured sender
// must not take endpoints). It reports whether peer is a member.
func (m *Membership) Heard(peer string, now time.Time) bool {
	for _, p := range m.peers {
		if p == peer {
			if now.After(m.lastHeard[peer]) {
				m.lastHeard[peer] = now
			}
			return true
		}
	}
	return false
}

// Unreachable records that a connection attempt to peer failed and that nothing was heard from it since before: a
// replica killed or stopped, or whose address no longer answers, is not live from now until heard again, without
// waiting for the timeout. A peer heard since before (its summaries still arrive while one connection attempt fails,
// say a handshake slower than the attempt's bound) stays live until the timeout, so a slow peer does not flap in and
// out of the live set. Peers outside the list are ignored.
func (m *Membership) Unreachable(peer string, before time.Time) {
	if t, ok := m.lastHeard[peer]; ok && t.Before(before) {
		delete(m.lastHeard, peer)
	}
}

// Live returns self and the peers heard within the timeout before now, sorted.
func (m *Membership) Live(now time.Time) []string {
	live := []string{m.self}
	for _, p := range m.peers {
		if t, ok := m.lastHeard[p]; ok && now.Sub(t) < m.timeout {
			live = append(live, p)
		}
	}
	return sortedUnique(live)
}

// ParsePeers reads a peer list as the --peers flag or a peers file gives it: host:port addresses separated by
// commas, spaces or newlines, '#' starting a comment to the end of its line. Duplicates are an error (a typo that
// would otherwise count one replica twice).
func ParsePeers(text string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var errs []error
	for i, line := range strings.Split(text, "\n") {
		if c := strings.IndexByte(line, '#'); c >= 0 {
			line = line[:c]
		}
		for _, p := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			host, port, err := net.SplitHostPort(p)
			switch {
			case err != nil || host == "" || port == "":
				errs = append(errs, fmt.Errorf("line %d: peer %q is not host:port", i+1, p))
			case seen[p]:
				errs = append(errs, fmt.Errorf("line %d: peer %q listed twice", i+1, p))
			}
			seen[p] = true
			out = append(out, p)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
