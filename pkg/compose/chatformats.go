package compose

import (
	"strings"

	"github.com/podium-llm/podium/pkg/events"
)

// formatNames are the chat formats a variant may name.
func formatNames() []string { return []string{"chatml", "llama3", "phi"} }

// flatten writes messages as the single prompt string a model of the format's family reads.
// Each format ends with the opening of the assistant's turn, so the prompt can go to a completion
// endpoint as it is.
func flatten(format string, msgs []events.Message) string {
	var b strings.Builder
	switch format {
	case "phi":
		// Phi-3 / Phi-4-mini: <|system|>, <|user|>, <|assistant|> headers, turns closed by <|end|>.
		for _, m := range msgs {
			b.WriteString("<|" + m.Role + "|>\n" + m.Content + "<|end|>\n")
		}
		b.WriteString("<|assistant|>\n")
	case "chatml":
		// ChatML (Qwen and many fine-tunes): <|im_start|>role ... <|im_end|>.
		for _, m := range msgs {
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		}
		b.WriteString("<|im_start|>assistant\n")
	case "llama3":
		// Llama 3: <|begin_of_text|>, then a header and a blank line before each turn, <|eot_id|> after.
		b.WriteString("<|begin_of_text|>")
		for _, m := range msgs {
			b.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + m.Content + "<|eot_id|>")
		}
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	default:
		// Without a chat format the messages are joined by a blank line.
		for i, m := range msgs {
			if i > 0 {
				b.WriteString("\n\n")
			}
			b.WriteString(m.Content)
		}
	}
	return b.String()
}
