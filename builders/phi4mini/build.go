//go:build wasip1

package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/podium-llm/podium/pkg/builder"
)

// build makes the system turn (who the team is, and the tools when the request's vars give
// them) and the user turn (the task, the round, the team's history with the evaluator's
// feedback and the leaderboard), flattened into Phi-4-mini's format.
func build(req builder.BuildRequest) builder.Built {
	c := req.Context
	team, _ := c["team"].(map[string]any)
	system := fmt.Sprintf("You are %s (team id %s), one of several teams competing on the same task over several rounds. An evaluator scores every submission; the best score wins. Answer with your complete submission only.",
		str(team["name"]), str(team["id"]))
	var user strings.Builder
	fmt.Fprintf(&user, "# Task\n%s\n\n# Round\nRound %s. Current time: %s\n", str(c["user_prompt"]), str(c["round_number"]), str(c["current_datetime"]))
	if history, _ := c["history"].([]any); len(history) > 0 {
		user.WriteString("\n# Your previous rounds\n")
		for _, h := range history {
			r, _ := h.(map[string]any)
			fmt.Fprintf(&user, "\n## Round %s: %s\n", str(r["round_number"]), str(r["score_text"]))
			if f := str(r["feedback"]); f != "" {
				fmt.Fprintf(&user, "Evaluator feedback: %s\n", f)
			}
			fmt.Fprintf(&user, "Your submission:\n%s\n", str(r["preview"]))
		}
	}
	if board, _ := c["leaderboard"].([]any); len(board) > 0 {
		user.WriteString("\n# Leaderboard\n")
		for _, b := range board {
			r, _ := b.(map[string]any)
			mark := ""
			if self, _ := r["is_self"].(bool); self {
				mark = " <- your team"
			}
			fmt.Fprintf(&user, "%s. %s: best %s in round %s%s\n", str(r["position"]), str(r["team_name"]), str(r["best_score_text"]), str(r["best_round"]), mark)
		}
	}
	if first, _ := c["is_first_round"].(bool); !first {
		fmt.Fprintf(&user, "\nKeep what scored well, fix what the evaluator criticised, and write your complete new submission for round %s.\n", str(c["round_number"]))
	}
	system += toolBlock(req.Vars["tools"])
	msgs := []builder.Message{{Role: "system", Content: system}, {Role: "user", Content: user.String()}}
	var prompt strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&prompt, "<|%s|>%s<|end|>", m.Role, m.Content)
	}
	prompt.WriteString("<|assistant|>")
	p := prompt.String()
	return builder.Built{Messages: msgs, Prompt: &p, Params: map[string]any{"temperature": 0.2, "stop": []string{"<|end|>"}}}
}

// toolBlock is Phi-4-mini's declaration of tools: their JSON list between <|tool|> and <|/tool|>.
func toolBlock(tools any) string {
	list, _ := tools.([]any)
	if len(list) == 0 {
		return ""
	}
	b, err := json.Marshal(list)
	if err != nil {
		return ""
	}
	return "<|tool|>" + string(b) + "<|/tool|>"
}

// str prints a context value: JSON numbers as their text, strings as they are, nothing as "".
func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.6f", x), "0"), ".")
	default:
		return fmt.Sprint(x)
	}
}
