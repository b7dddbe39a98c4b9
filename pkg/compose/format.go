package compose

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/podium-llm/podium/pkg/events"
)

// The texts of mixseek-core's UserPromptBuilder, byte for byte (docs/prompts.md).
const (
	noSubmissions        = "まだ過去のSubmissionはありません。"
	noRanking            = "まだランキング情報がありません。"
	unrankedMessage      = "まだあなたのチームの順位はありません。"
	firstPlaceMessage    = "🏆 現在、あなたのチームは1位です！この調子で頑張ってください。"
	topThreeMessage      = "現在、%dチーム中%d位です。素晴らしい成績です！"
	belowTopThreeMessage = "現在、%dチーム中%d位です。"
)

// score2 is Python's f"{x:.2f}": both round half to even on the binary value, as %.2f does.
func score2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

// pyFloatRepr prints a float as Python's repr does: the shortest digits that round-trip,
// positional with a ".0" when the decimal exponent is in [-4, 16), scientific otherwise
// ("1e-05", "1.5e+16").
func pyFloatRepr(x float64) string {
	sci := strconv.FormatFloat(x, 'e', -1, 64) // Go, like Python, writes at least two exponent digits
	_, expText, _ := strings.Cut(sci, "e")
	if exp, _ := strconv.Atoi(expText); exp < -4 || exp >= 16 {
		return sci
	}
	s := strconv.FormatFloat(x, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// isoformat prints t as Python's datetime.isoformat() does for an aware datetime: microseconds
// only when non-zero, and the offset as +HH:MM (UTC is +00:00).
func isoformat(t time.Time) string {
	t = t.Truncate(time.Microsecond)
	layout := "2006-01-02T15:04:05-07:00"
	if t.Nanosecond() != 0 {
		layout = "2006-01-02T15:04:05.000000-07:00"
	}
	return t.Format(layout)
}

// pyJSONString quotes s as Python's json.dumps(ensure_ascii=False) does: only '"', '\\' and
// control characters are escaped; '<', '>', '&' and non-ASCII stay as they are.
func pyJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// scoreDetailsJSON is json.dumps({"overall_score", "metrics"}, indent=2, ensure_ascii=False)
// of one round, keys in that order.
func scoreDetailsJSON(r events.TeamRound) string {
	var b strings.Builder
	b.WriteString("{\n  \"overall_score\": ")
	b.WriteString(pyFloatRepr(r.OverallScore))
	b.WriteString(",\n  \"metrics\": ")
	if len(r.Metrics) == 0 {
		b.WriteString("[]")
	} else {
		b.WriteString("[\n")
		for i, m := range r.Metrics {
			b.WriteString("    {\n      \"metric_name\": ")
			pyJSONString(&b, m.MetricName)
			b.WriteString(",\n      \"score\": ")
			b.WriteString(pyFloatRepr(m.Score))
			b.WriteString(",\n      \"evaluator_comment\": ")
			pyJSONString(&b, m.EvaluatorComment)
			b.WriteString("\n    }")
			if i < len(r.Metrics)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString("  ]")
	}
	b.WriteString("\n}")
	return b.String()
}

// submissionBlock is one round of submission_history.
func submissionBlock(r events.TeamRound) string {
	return fmt.Sprintf("## ラウンド %d\n### スコア: %s/100\n### スコア詳細:\n%s\n### あなたの提出内容:\n%s",
		r.RoundNumber, score2(r.OverallScore), scoreDetailsJSON(r), r.Submission.Content)
}

// submissionHistory is mixseek's text of every earlier round of the team, whole.
func submissionHistory(rounds []events.TeamRound) string {
	if len(rounds) == 0 {
		return noSubmissions
	}
	blocks := make([]string, len(rounds))
	for i, r := range rounds {
		blocks[i] = submissionBlock(r)
	}
	return strings.Join(blocks, "\n\n")
}

// rankingLine is one row of ranking_table.
func rankingLine(row events.LeaderboardRow, self bool) string {
	if self {
		return fmt.Sprintf("**#%d %s (あなたのチーム) - スコア: %s/100 (ラウンド数: %d)**", row.Position, row.TeamName, score2(row.BestScore), row.Rounds)
	}
	return fmt.Sprintf("#%d %s - スコア: %s/100 (ラウンド数: %d)", row.Position, row.TeamName, score2(row.BestScore), row.Rounds)
}

// rankingTable is mixseek's leaderboard text: every row, the requesting team in bold.
func rankingTable(rows []events.LeaderboardRow, teamID string) string {
	if len(rows) == 0 {
		return noRanking
	}
	lines := make([]string, len(rows))
	for i, row := range rows {
		lines[i] = rankingLine(row, row.TeamID == teamID)
	}
	return strings.Join(lines, "\n")
}

// teamPositionMessage is mixseek's one-line standing; position 0 means unranked.
func teamPositionMessage(position, teams int) string {
	switch {
	case position <= 0:
		return unrankedMessage
	case position == 1:
		return firstPlaceMessage
	case position <= 3:
		return fmt.Sprintf(topThreeMessage, teams, position)
	default:
		return fmt.Sprintf(belowTopThreeMessage, teams, position)
	}
}

// preview keeps a submission's head and tail when it is longer than limit characters, with a
// visible marker saying how much was left out.
func preview(s string, limit int) (string, bool) {
	n := utf8.RuneCountInString(s)
	if limit <= 0 || n <= limit {
		return s, false
	}
	// Byte offsets of the cuts, found by walking runes from each end: a submission can be
	// long, and converting it to []rune would copy it four times over.
	head := limit / 2
	end := 0
	for range head {
		_, size := utf8.DecodeRuneInString(s[end:])
		end += size
	}
	start := len(s)
	for range limit - head {
		_, size := utf8.DecodeLastRuneInString(s[:start])
		start -= size
	}
	return s[:end] + "\n[… " + strconv.Itoa(n-limit) + " characters omitted …]\n" + s[start:], true
}

// signed prints a score difference with its sign, "+8.50" or "-2.00".
func signed(d float64) string {
	if d >= 0 {
		return "+" + score2(d)
	}
	return score2(d)
}
