package serving

// ChatPromptTokens is the number of prompt tokens the engine gives the
// OpenAI chat completions request body: its messages rendered with the
// model's chat template (tools, tool_choice and response_format included,
// as a request renders them) and tokenized — what usage.prompt_tokens of
// that request reports. Nothing runs: the reasoning switcher's choice,
// made when a request runs, is not anticipated (a switched request may
// count a few tokens more). A prompt longer than the context, or a request
// beyond the engine's other limits, is still counted. Errors: a body the
// engine refuses before its prompt is tokenized (the 4xx the request would
// get: an unknown model, a malformed message, an unsupported schema).
func (e *Engine) ChatPromptTokens(body []byte) (int, error) {
	_, r, err := e.parseRequest(body, true, false)
	if r.Prompt != nil {
		return len(r.Prompt), nil
	}
	return 0, err
}
