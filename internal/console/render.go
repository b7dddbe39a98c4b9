package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
)

var errNotConnected = errors.New("not connected to NATS")

// pageError is an answer other than 200: a bad or unknown address (4xx), or a source that
// failed (503).
type pageError struct {
	Status  int
	Message string
}

func (e *pageError) Error() string { return e.Message }

func notFound(format string, args ...any) error {
	return &pageError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return &pageError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// fail answers err as the error page: its status when it is a pageError, else 503 (NATS or
// ClickHouse failed; the page says which and can be loaded again).
func (c *Console) fail(w http.ResponseWriter, r *http.Request, name string, err error) {
	var pe *pageError
	if !errors.As(err, &pe) {
		c.m.pageErrors.WithLabelValues(name).Inc()
		c.d.Log.Warn("page failed", "page", name, "path", r.URL.Path, "error", err)
		status := http.StatusServiceUnavailable
		if errors.Is(err, context.Canceled) {
			status = 499 // the viewer went away
		}
		pe = &pageError{status, err.Error()}
	}
	c.render(w, "error", pe.Status, pe)
}

// render executes a page into a buffer first, so a failing template never sends half a page.
func (c *Console) render(w http.ResponseWriter, name string, status int, data any) {
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		c.d.Log.Error("page template failed", "page", name, "error", err)
		http.Error(w, "500 the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// parsePages parses the layout with each page's template.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"micros": func(us int64) string {
			if us == 0 {
				return ""
			}
			return time.UnixMicro(us).UTC().Format("2006-01-02 15:04:05Z")
		},
		"when":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"score": func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) },
		"kib":   func(n int) string { return strconv.FormatFloat(float64(n)/1024, 'f', 1, 64) + " KiB" },
		"add":   func(a, b int) int { return a + b },
		"pre":   preText,
	}
	layout, err := template.New("layout").Funcs(funcs).ParseFS(webFS, "web/layout.html", "web/chart.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	names, err := fs.Glob(webFS, "web/pages/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		t, err := template.Must(layout.Clone()).ParseFS(webFS, n)
		if err != nil {
			return nil, fmt.Errorf("console: templates: %w", err)
		}
		pages[strings.TrimSuffix(strings.TrimPrefix(n, "web/pages/"), ".html")] = t
	}
	return pages, nil
}
