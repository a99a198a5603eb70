package route

// ModelNames lists the client model names the target serves now, sorted:
// its declared names and aliases and, for kind engine, every model the
// engine serves at this moment (base and "<base>:<adapter>"). The xDS
// control plane (package envoy) makes a route per name.
func (t *Target) ModelNames() []string { return t.modelNames() }
