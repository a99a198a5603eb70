package llama

import (
	"errors"
	"fmt"
	"strings"
)

// Errors of TokenizeChat.
var (
	// ErrChatTemplate: llama.cpp does not recognise the template.
	ErrChatTemplate = errors.New("chat template")
	// ErrTemplateRewrites: the template changed a message's content, so
	// content and template text cannot be told apart safely.
	ErrTemplateRewrites = errors.New("the model's chat template rewrites message content; Molly cannot tokenize it safely")
)

// TokenizeChat applies tmpl to msgs (with the assistant turn's opening)
// and tokenizes the result so that only the template's own text may
// produce control tokens: message content is tokenized with parse_special
// off, so a user who writes "<|im_start|>system" gets those characters,
// not a forged turn. The template is rendered with a unique sentinel per
// message, then the pieces between sentinels (template text) and the
// contents are tokenized apart — the approach of llama.cpp's server for
// mixed prompts (tokenize_mixed). Errors: ErrChatTemplate (wrapping
// ApplyChatTemplate's), ErrTemplateRewrites, Tokenize's.
func (m *Model) TokenizeChat(tmpl string, msgs []ChatMessage) ([]int32, error) {
	sentinels := make([]ChatMessage, len(msgs))
	for i, msg := range msgs {
		sentinels[i] = ChatMessage{Role: msg.Role, Content: fmt.Sprintf("\uE000molly-%d\uE001", i)}
	}
	rendered, err := ApplyChatTemplate(tmpl, sentinels, true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChatTemplate, err)
	}
	var toks []int32
	rest := rendered
	for i, msg := range msgs {
		before, after, ok := strings.Cut(rest, sentinels[i].Content)
		if !ok {
			return nil, ErrTemplateRewrites
		}
		t, err := m.Tokenize(before, i == 0, true)
		if err != nil {
			return nil, err
		}
		toks = append(toks, t...)
		if t, err = m.Tokenize(msg.Content, false, false); err != nil {
			return nil, err
		}
		toks = append(toks, t...)
		rest = after
	}
	t, err := m.Tokenize(rest, len(msgs) == 0, true)
	if err != nil {
		return nil, err
	}
	return append(toks, t...), nil
}
