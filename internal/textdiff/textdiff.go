// Package textdiff writes the differences between two texts as a unified diff: what `podium
// prompts diff`, `podium templates diff` and the console show.
package textdiff

import (
	"fmt"
	"io"
	"strings"
)

// Unified writes the differences between two texts as a unified diff with context lines.
// Prompts are a few hundred lines, so the longest common subsequence of lines is computed
// directly (O(n·m)); identical texts write nothing.
func Unified(w io.Writer, nameA, nameB, a, b string, context int) {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	// lcs[i][j] is the length of the longest common subsequence of la[i:] and lb[j:].
	lcs := make([][]int, len(la)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(lb)+1)
	}
	for i := len(la) - 1; i >= 0; i-- {
		for j := len(lb) - 1; j >= 0; j-- {
			if la[i] == lb[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte // ' ', '-', '+'
		text string
		a, b int // line numbers (1-based) in each text at this point
	}
	var ops []line
	i, j := 0, 0
	for i < len(la) || j < len(lb) {
		switch {
		case i < len(la) && j < len(lb) && la[i] == lb[j]:
			ops = append(ops, line{' ', la[i], i + 1, j + 1})
			i, j = i+1, j+1
		case i < len(la) && (j == len(lb) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, line{'-', la[i], i + 1, j + 1}) // deletions first, as diff(1) prints them
			i++
		default:
			ops = append(ops, line{'+', lb[j], i + 1, j + 1})
			j++
		}
	}
	header := false
	for k := 0; k < len(ops); {
		if ops[k].op == ' ' {
			k++
			continue
		}
		// A hunk: from context lines before this change to context lines after the last change
		// that lies within 2*context lines of the one before it.
		start := max(k-context, 0)
		end := k
		for end < len(ops) {
			next := end
			for next < len(ops) && ops[next].op == ' ' {
				next++
			}
			if next == len(ops) || next-end > 2*context {
				break
			}
			for next < len(ops) && ops[next].op != ' ' {
				next++
			}
			end = next
		}
		end = min(end+context, len(ops))
		if !header {
			fmt.Fprintf(w, "--- %s\n+++ %s\n", nameA, nameB)
			header = true
		}
		countA, countB := 0, 0
		for _, op := range ops[start:end] {
			if op.op != '+' {
				countA++
			}
			if op.op != '-' {
				countB++
			}
		}
		fmt.Fprintf(w, "@@ -%d,%d +%d,%d @@\n", ops[start].a, countA, ops[start].b, countB)
		for _, op := range ops[start:end] {
			fmt.Fprintf(w, "%c%s\n", op.op, op.text)
		}
		k = end
	}
}
