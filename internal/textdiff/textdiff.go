// Package textdiff writes the differences between two texts as a unified diff: what `podium
// prompts diff`, `podium templates diff` and the console show.
package textdiff

import (
	"fmt"
	"io"
	"strings"
)

// maxCells bounds the longest-common-subsequence table (4 bytes a cell: 64 MiB). Past it the
// lines that differ are written as one change, all removed then all added: still a correct diff,
// only not the shortest, and a 1 MiB prompt of one-letter lines costs milliseconds, not the
// hundreds of GiB a full table would.
const maxCells = 16 << 20

type line struct {
	op   byte // ' ', '-', '+'
	text string
	a, b int // line numbers (1-based) in each text at this point
}

// Unified writes the differences between two texts as a unified diff with context lines.
// Identical texts write nothing.
func Unified(w io.Writer, nameA, nameB, a, b string, context int) {
	ops := edits(strings.Split(a, "\n"), strings.Split(b, "\n"))
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

// edits turns la into lb line by line. Two rounds' prompts share most of their lines, so the
// common head and tail are matched directly and only the lines between them are compared.
func edits(la, lb []string) []line {
	head := 0
	for head < len(la) && head < len(lb) && la[head] == lb[head] {
		head++
	}
	tail := 0
	for tail < len(la)-head && tail < len(lb)-head && la[len(la)-1-tail] == lb[len(lb)-1-tail] {
		tail++
	}
	ops := make([]line, 0, len(la)+len(lb)-head-tail)
	for i := range head {
		ops = append(ops, line{' ', la[i], i + 1, i + 1})
	}
	ma, mb := la[head:len(la)-tail], lb[head:len(lb)-tail]
	ops = append(ops, middle(ma, mb, head)...)
	for k := range tail {
		i, j := len(la)-tail+k, len(lb)-tail+k
		ops = append(ops, line{' ', la[i], i + 1, j + 1})
	}
	return ops
}

// middle diffs the lines between the common head (off lines) and tail: by their longest common
// subsequence when its table fits maxCells, else as one change.
func middle(la, lb []string, off int) []line {
	n, m := len(la), len(lb)
	var ops []line
	if n*m > maxCells {
		for i := range la {
			ops = append(ops, line{'-', la[i], off + i + 1, off + 1})
		}
		for j := range lb {
			ops = append(ops, line{'+', lb[j], off + n + 1, off + j + 1})
		}
		return ops
	}
	// lcs[i*(m+1)+j] is the length of the longest common subsequence of la[i:] and lb[j:].
	lcs := make([]int32, (n+1)*(m+1))
	at := func(i, j int) int32 { return lcs[i*(m+1)+j] }
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if la[i] == lb[j] {
				lcs[i*(m+1)+j] = at(i+1, j+1) + 1
			} else {
				lcs[i*(m+1)+j] = max(at(i+1, j), at(i, j+1))
			}
		}
	}
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && la[i] == lb[j]:
			ops = append(ops, line{' ', la[i], off + i + 1, off + j + 1})
			i, j = i+1, j+1
		case i < n && (j == m || at(i+1, j) >= at(i, j+1)):
			ops = append(ops, line{'-', la[i], off + i + 1, off + j + 1}) // deletions first, as diff(1) prints them
			i++
		default:
			ops = append(ops, line{'+', lb[j], off + i + 1, off + j + 1})
			j++
		}
	}
	return ops
}
