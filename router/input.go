package router

// PolicyInput is PolicyInputFor a caller known only by its member name,
// without scopes.
func PolicyInput(a *Annotation, member string, c *Catalogue) map[string]any {
	return PolicyInputFor(a, &Identity{Member: member}, c)
}

// PolicyInputFor builds the OPA input document for a (schema in
// policies/README.md). It carries no request text: only the classification,
// counts of findings by type, the caller's identity (nil: member
// "anonymous" without scopes; never the key) and the targets.
func PolicyInputFor(a *Annotation, id *Identity, c *Catalogue) map[string]any {
	findings := make(map[string]any, len(a.Sovereignty.Findings))
	for t, n := range a.Sovereignty.Findings {
		findings[t] = n
	}
	mods := make([]any, len(a.Modalities))
	for i, m := range a.Modalities {
		mods[i] = m
	}
	var targets []any
	if c != nil {
		for _, t := range c.targets {
			targets = append(targets, t.PolicyView())
		}
	}
	if targets == nil {
		targets = []any{}
	}
	return map[string]any{
		"request": map[string]any{
			"endpoint": string(a.Endpoint),
			"model":    a.Model,
			"stream":   a.Stream,
		},
		"capability": map[string]any{
			"task":          a.Task,
			"modalities":    mods,
			"prompt_tokens": a.PromptTokens,
			"max_tokens":    a.MaxTokens,
			"tools":         a.Tools,
		},
		"sovereignty": map[string]any{
			"sensitivity": a.Sensitivity.String(),
			"detected":    a.Detected.String(),
			"declared":    a.Declared.String(),
			"findings":    findings,
			"opaque":      a.Opaque,
			"scan_failed": a.ScanFailed,
			"residency":   a.Residency,
		},
		"identity": identityInput(id),
		"targets":  targets,
	}
}
