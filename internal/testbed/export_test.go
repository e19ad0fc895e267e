package testbed

// ForwardRuleFor sets up the FORWARD rule a bed makes for its bridge, for
// a bridge name of the caller's; Close removes it.
func ForwardRuleFor(bridge string) (*Bed, error) {
	b := &Bed{Bridge: bridge}
	return b, b.bridgeNetfilter()
}
