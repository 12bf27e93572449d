package plugins

import (
	"k8s.io/utils/clock"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

// ClockHandle is a plugin Handle that also names the clock Sluice's plugins read: the virtual-time benchmark engine
// loads an EndpointPickerConfig through one, so that every Sluice plugin decides on the virtual clock. With any other
// Handle (the EPP's) they read the wall clock. Only the plugins' notion of now comes from it; maintenance goroutines
// bound to the handle's context keep their own tickers.
type ClockHandle interface {
	fwkplugin.Handle
	Clock() clock.PassiveClock
}

// clockOf returns the clock of handle if it is a ClockHandle, else def.
func clockOf(handle fwkplugin.Handle, def clock.PassiveClock) clock.PassiveClock {
	if h, ok := handle.(ClockHandle); ok && h.Clock() != nil {
		return h.Clock()
	}
	return def
}
