/*
 * phi4mini.c: Podium's example prompt builder for Phi-4-mini (docs/builders.md), in C: the same
 * builder as builders/phi4mini (Go), answering the same bytes on the same input. It reads one
 * JSON request on stdin ({"op":"build",...} or {"op":"parse",...}) and writes one JSON answer on
 * stdout, as encoding/json writes the Go builder's (keys in order, HTML left unescaped in the
 * answer, the tools block and tool arguments as json.Marshal writes them).
 *
 * Build it as a reactor, whose runtime starts once per module (the way to serve it: podium_run is
 * each call), with Debian's clang and wasi-libc (build.sh, make builders):
 *
 *   clang --target=wasm32-wasi --sysroot=/usr -O2 -mexec-model=reactor -o phi4mini.wasm phi4mini.c
 *
 * or as a command (main is each call) without -mexec-model. Either way it reads stdin and writes
 * stdout with read and write, not stdio: a reactor's calls start from the memory its start left
 * (docs/builders.md), where stdio's buffers and end-of-file flags would be a call's before.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- output buffers ---- */

typedef struct {
    char *b;
    size_t n, cap;
} buf;

static void put(buf *o, const char *s, size_t n) {
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1) cap *= 2;
        o->b = realloc(o->b, cap);
        if (!o->b) { fputs("out of memory\n", stderr); exit(1); }
        o->cap = cap;
    }
    memcpy(o->b + o->n, s, n);
    o->n += n;
    o->b[o->n] = 0;
}
static void puts_(buf *o, const char *s) { put(o, s, strlen(s)); }
static void putb(buf *o, buf *s) { put(o, s->b ? s->b : "", s->n); }
static void printf_(buf *o, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    put(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* emit writes the answer to stdout whole. */
static void emit(buf *o) {
    size_t done = 0;
    while (done < o->n) {
        ssize_t n = write(1, o->b + done, o->n - done);
        if (n <= 0) { fputs("writing the answer failed\n", stderr); exit(1); }
        done += (size_t)n;
    }
}

static void fail(const char *why) {
    fprintf(stderr, "%s\n", why);
    exit(1);
}

/* ---- JSON values ---- */

enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    int t;
    double num;
    buf s;               /* a string's UTF-8 bytes */
    struct jv **items;   /* an array's values, an object's values */
    buf *keys;           /* an object's keys */
    size_t n;
} jv;

typedef struct {
    const char *p, *end;
    int depth;
} parser;

static void ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static void utf8(buf *o, unsigned r) {
    char c[4];
    if (r < 0x80) { c[0] = (char)r; put(o, c, 1); }
    else if (r < 0x800) { c[0] = (char)(0xC0 | r >> 6); c[1] = (char)(0x80 | (r & 0x3F)); put(o, c, 2); }
    else if (r < 0x10000) { c[0] = (char)(0xE0 | r >> 12); c[1] = (char)(0x80 | (r >> 6 & 0x3F)); c[2] = (char)(0x80 | (r & 0x3F)); put(o, c, 3); }
    else { c[0] = (char)(0xF0 | r >> 18); c[1] = (char)(0x80 | (r >> 12 & 0x3F)); c[2] = (char)(0x80 | (r >> 6 & 0x3F)); c[3] = (char)(0x80 | (r & 0x3F)); put(o, c, 4); }
}

static int hex4(parser *ps, unsigned *r) {
    if (ps->end - ps->p < 4) return 0;
    *r = 0;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        *r <<= 4;
        if (c >= '0' && c <= '9') *r |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') *r |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') *r |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    return 1;
}

static int pstring(parser *ps, buf *o) {
    if (ps->p >= ps->end || *ps->p != '"') return 0;
    ps->p++;
    put(o, "", 0);
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) return 0;
        if (c != '\\') {
            /* a run of plain bytes at once: most of a context is text */
            const char *run = ps->p;
            while (ps->p < ps->end && *ps->p != '"' && *ps->p != '\\' && (unsigned char)*ps->p >= 0x20) ps->p++;
            put(o, run, (size_t)(ps->p - run));
            continue;
        }
        if (++ps->p >= ps->end) return 0;
        char e = *ps->p++;
        unsigned r, r2;
        switch (e) {
        case '"': put(o, "\"", 1); break;
        case '\\': put(o, "\\", 1); break;
        case '/': put(o, "/", 1); break;
        case 'b': put(o, "\b", 1); break;
        case 'f': put(o, "\f", 1); break;
        case 'n': put(o, "\n", 1); break;
        case 'r': put(o, "\r", 1); break;
        case 't': put(o, "\t", 1); break;
        case 'u':
            if (!hex4(ps, &r)) return 0;
            if (r >= 0xD800 && r < 0xDC00) {
                /* a surrogate pair, or U+FFFD as encoding/json reads a lone one */
                const char *save = ps->p;
                if (ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                    ps->p += 2;
                    if (hex4(ps, &r2) && r2 >= 0xDC00 && r2 < 0xE000) {
                        utf8(o, 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00));
                        break;
                    }
                }
                ps->p = save;
                utf8(o, 0xFFFD);
            } else if (r >= 0xDC00 && r < 0xE000) {
                utf8(o, 0xFFFD);
            } else {
                utf8(o, r);
            }
            break;
        default: return 0;
        }
    }
    if (ps->p >= ps->end) return 0;
    ps->p++;
    return 1;
}

static jv *value(parser *ps);

static jv *newv(int t) {
    jv *v = calloc(1, sizeof *v);
    if (!v) fail("out of memory");
    v->t = t;
    return v;
}

static jv *value(parser *ps) {
    ws(ps);
    if (ps->p >= ps->end || ++ps->depth > 1000) return NULL;
    jv *v = NULL;
    char c = *ps->p;
    if (c == '{' || c == '[') {
        int obj = c == '{';
        v = newv(obj ? J_OBJ : J_ARR);
        ps->p++;
        ws(ps);
        size_t cap = 0;
        if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) { ps->p++; ps->depth--; return v; }
        for (;;) {
            buf key = {0};
            ws(ps);
            if (obj) {
                if (!pstring(ps, &key)) return NULL;
                ws(ps);
                if (ps->p >= ps->end || *ps->p++ != ':') return NULL;
            }
            jv *item = value(ps);
            if (!item) return NULL;
            if (v->n == cap) {
                cap = cap ? cap * 2 : 8;
                v->items = realloc(v->items, cap * sizeof *v->items);
                if (obj) v->keys = realloc(v->keys, cap * sizeof *v->keys);
                if (!v->items || (obj && !v->keys)) fail("out of memory");
            }
            if (obj) v->keys[v->n] = key;
            v->items[v->n++] = item;
            ws(ps);
            if (ps->p >= ps->end) return NULL;
            if (*ps->p == ',') { ps->p++; continue; }
            if (*ps->p++ != (obj ? '}' : ']')) return NULL;
            break;
        }
    } else if (c == '"') {
        v = newv(J_STR);
        if (!pstring(ps, &v->s)) return NULL;
    } else if (!strncmp(ps->p, "null", 4) && ps->end - ps->p >= 4) { v = newv(J_NULL); ps->p += 4; }
    else if (!strncmp(ps->p, "true", 4) && ps->end - ps->p >= 4) { v = newv(J_TRUE); ps->p += 4; }
    else if (!strncmp(ps->p, "false", 5) && ps->end - ps->p >= 5) { v = newv(J_FALSE); ps->p += 5; }
    else if (c == '-' || (c >= '0' && c <= '9')) {
        char tmp[64];
        size_t n = 0;
        while (ps->p < ps->end && n < sizeof tmp - 1 && strchr("+-0123456789.eE", *ps->p)) tmp[n++] = *ps->p++;
        tmp[n] = 0;
        char *endp;
        v = newv(J_NUM);
        v->num = strtod(tmp, &endp);
        if (*endp) return NULL;
    } else {
        return NULL;
    }
    ps->depth--;
    return v;
}

/* get is an object's value of key (the last one, as encoding/json keeps); NULL when absent. */
static jv *get(jv *o, const char *key) {
    if (!o || o->t != J_OBJ) return NULL;
    for (size_t i = o->n; i-- > 0;)
        if (o->keys[i].n == strlen(key) && !memcmp(o->keys[i].b, key, o->keys[i].n)) return o->items[i];
    return NULL;
}

/* ---- numbers as Go writes them ---- */

/* shortest writes the shortest decimal digits that read back as x ("%.*e" form), returning them
 * and the decimal exponent of the first digit, as strconv's shortest formatting does. */
static void shortest(double x, char *digits, int *exp10) {
    char tmp[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    char *e = strchr(tmp, 'e');
    *exp10 = atoi(e + 1);
    size_t n = 0;
    for (char *p = tmp; p < e; p++)
        if (*p >= '0' && *p <= '9') digits[n++] = *p;
    while (n > 1 && digits[n - 1] == '0') n--;
    digits[n] = 0;
}

/* jsonnum writes x as encoding/json does: 'f' form, or 'e' below 1e-6 and from 1e21. */
static void jsonnum(buf *o, double x) {
    if (x == 0) { puts_(o, signbit(x) ? "-0" : "0"); return; }
    if (x < 0) { puts_(o, "-"); x = -x; }
    char d[32];
    int e;
    shortest(x, d, &e);
    int nd = (int)strlen(d);
    if (x < 1e-6 || x >= 1e21) {
        put(o, d, 1);
        if (nd > 1) { puts_(o, "."); put(o, d + 1, (size_t)nd - 1); }
        printf_(o, "e%c%s%d", e < 0 ? '-' : '+', (e > -10 && e < 10 && e >= 0) ? "0" : "", e < 0 ? -e : e);
        return;
    }
    if (e < 0) {
        puts_(o, "0.");
        for (int i = -1; i > e; i--) puts_(o, "0");
        puts_(o, d);
    } else if (nd <= e + 1) {
        puts_(o, d);
        for (int i = nd; i <= e; i++) puts_(o, "0");
    } else {
        put(o, d, (size_t)e + 1);
        puts_(o, ".");
        puts_(o, d + e + 1);
    }
}

/* ---- strings as encoding/json writes them ---- */

/* decode reads one UTF-8 sequence at s (n bytes left); 0 when it is not valid (one byte used). */
static unsigned decode(const unsigned char *s, size_t n, size_t *used) {
    *used = 1;
    if (s[0] < 0x80) return s[0];
    int len = s[0] >= 0xF0 && s[0] < 0xF5 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 && s[0] < 0xE0 ? 2 : 0;
    if (!len || (size_t)len > n) return 0;
    unsigned r = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        r = r << 6 | (s[i] & 0x3F);
    }
    if ((len == 3 && (r < 0x800 || (r >= 0xD800 && r < 0xE000))) || (len == 4 && (r < 0x10000 || r > 0x10FFFF))) return 0;
    *used = (size_t)len;
    return r;
}

static void jsonstr(buf *o, const char *s, size_t n, int html) {
    static const char hex[] = "0123456789abcdef";
    puts_(o, "\"");
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        /* a run of bytes written as they are, at once */
        size_t run = i;
        while (run < n && (unsigned char)s[run] >= 0x20 && (unsigned char)s[run] < 0x80 && s[run] != '"' && s[run] != '\\' &&
               !(html && (s[run] == '<' || s[run] == '>' || s[run] == '&')))
            run++;
        if (run > i) { put(o, s + i, run - i); i = run; continue; }
        if (c < 0x80) {
            i++;
            if (c == '"') puts_(o, "\\\"");
            else if (c == '\\') puts_(o, "\\\\");
            else if (c == '\b') puts_(o, "\\b");
            else if (c == '\f') puts_(o, "\\f");
            else if (c == '\n') puts_(o, "\\n");
            else if (c == '\r') puts_(o, "\\r");
            else if (c == '\t') puts_(o, "\\t");
            else if (c < 0x20 || (html && (c == '<' || c == '>' || c == '&'))) {
                char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
                puts_(o, u);
            } else put(o, (const char *)&c, 1);
            continue;
        }
        size_t used;
        unsigned r = decode((const unsigned char *)s + i, n - i, &used);
        if (!r) puts_(o, "\\ufffd");
        else if (r == 0x2028) puts_(o, "\\u2028");
        else if (r == 0x2029) puts_(o, "\\u2029");
        else put(o, s + i, used);
        i += used;
    }
    puts_(o, "\"");
}

/* marshal writes v as encoding/json does: object keys sorted; <, > and & escaped when html (as
 * json.Marshal does), not otherwise (as the builder's answer's encoder does). */
static void marshal(buf *o, jv *v, int html) {
    switch (v->t) {
    case J_NULL: puts_(o, "null"); return;
    case J_TRUE: puts_(o, "true"); return;
    case J_FALSE: puts_(o, "false"); return;
    case J_NUM: jsonnum(o, v->num); return;
    case J_STR: jsonstr(o, v->s.b ? v->s.b : "", v->s.n, html); return;
    case J_ARR:
        puts_(o, "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i) puts_(o, ",");
            marshal(o, v->items[i], html);
        }
        puts_(o, "]");
        return;
    case J_OBJ: {
        /* each key once (the last value), in byte order */
        size_t *idx = malloc((v->n + 1) * sizeof *idx), m = 0;
        for (size_t i = 0; i < v->n; i++) {
            int later = 0;
            for (size_t j = i + 1; j < v->n; j++)
                if (v->keys[j].n == v->keys[i].n && !memcmp(v->keys[j].b, v->keys[i].b, v->keys[i].n)) later = 1;
            if (!later) idx[m++] = i;
        }
        for (size_t i = 1; i < m; i++)
            for (size_t j = i; j > 0; j--) {
                buf *a = &v->keys[idx[j - 1]], *b = &v->keys[idx[j]];
                size_t n = a->n < b->n ? a->n : b->n;
                int c = memcmp(a->b ? a->b : "", b->b ? b->b : "", n);
                if (c < 0 || (c == 0 && a->n <= b->n)) break;
                size_t t = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = t;
            }
        puts_(o, "{");
        for (size_t i = 0; i < m; i++) {
            if (i) puts_(o, ",");
            jsonstr(o, v->keys[idx[i]].b ? v->keys[idx[i]].b : "", v->keys[idx[i]].n, html);
            puts_(o, ":");
            marshal(o, v->items[idx[i]], html);
        }
        puts_(o, "}");
        free(idx);
        return;
    }
    }
}

/* str prints a context value as the Go builder's str: strings as they are, numbers with %.6f
 * and the trailing zeros dropped, booleans as true or false, nothing as "". */
static void str(buf *o, jv *v) {
    if (!v || v->t == J_NULL) return;
    if (v->t == J_STR) { putb(o, &v->s); return; }
    if (v->t == J_TRUE || v->t == J_FALSE) { puts_(o, v->t == J_TRUE ? "true" : "false"); return; }
    if (v->t == J_NUM) {
        char tmp[400];
        snprintf(tmp, sizeof tmp, "%.6f", v->num);
        size_t n = strlen(tmp);
        while (n > 0 && tmp[n - 1] == '0') n--;
        if (n > 0 && tmp[n - 1] == '.') n--;
        put(o, tmp, n);
        return;
    }
    /* a list or an object: as fmt.Sprint would, its JSON here (no example's variable is one) */
    marshal(o, v, 1);
}

/* ---- the builder ---- */

static void build(jv *req) {
    jv *c = get(req, "context");
    jv *team = get(c, "team");
    buf system = {0}, user = {0}, prompt = {0}, out = {0};
    puts_(&system, "You are ");
    str(&system, get(team, "name"));
    puts_(&system, " (team id ");
    str(&system, get(team, "id"));
    puts_(&system, "), one of several teams competing on the same task over several rounds. An evaluator scores every submission; the best score wins. Answer with your complete submission only.");

    puts_(&user, "# Task\n");
    str(&user, get(c, "user_prompt"));
    puts_(&user, "\n\n# Round\nRound ");
    str(&user, get(c, "round_number"));
    puts_(&user, ". Current time: ");
    str(&user, get(c, "current_datetime"));
    puts_(&user, "\n");
    jv *history = get(c, "history");
    if (history && history->t == J_ARR && history->n > 0) {
        puts_(&user, "\n# Your previous rounds\n");
        for (size_t i = 0; i < history->n; i++) {
            jv *r = history->items[i]->t == J_OBJ ? history->items[i] : NULL;
            puts_(&user, "\n## Round ");
            str(&user, get(r, "round_number"));
            puts_(&user, ": ");
            str(&user, get(r, "score_text"));
            puts_(&user, "\n");
            buf f = {0};
            str(&f, get(r, "feedback"));
            if (f.n > 0) { puts_(&user, "Evaluator feedback: "); putb(&user, &f); puts_(&user, "\n"); }
            puts_(&user, "Your submission:\n");
            str(&user, get(r, "preview"));
            puts_(&user, "\n");
        }
    }
    jv *board = get(c, "leaderboard");
    if (board && board->t == J_ARR && board->n > 0) {
        puts_(&user, "\n# Leaderboard\n");
        for (size_t i = 0; i < board->n; i++) {
            jv *r = board->items[i]->t == J_OBJ ? board->items[i] : NULL;
            str(&user, get(r, "position"));
            puts_(&user, ". ");
            str(&user, get(r, "team_name"));
            puts_(&user, ": best ");
            str(&user, get(r, "best_score_text"));
            puts_(&user, " in round ");
            str(&user, get(r, "best_round"));
            jv *self = get(r, "is_self");
            if (self && self->t == J_TRUE) puts_(&user, " <- your team");
            puts_(&user, "\n");
        }
    }
    jv *first = get(c, "is_first_round");
    if (!first || first->t != J_TRUE) {
        puts_(&user, "\nKeep what scored well, fix what the evaluator criticised, and write your complete new submission for round ");
        str(&user, get(c, "round_number"));
        puts_(&user, ".\n");
    }
    jv *tools = get(get(req, "vars"), "tools");
    if (tools && tools->t == J_ARR && tools->n > 0) {
        puts_(&system, "<|tool|>");
        marshal(&system, tools, 1); /* json.Marshal, as the Go builder's toolBlock */
        puts_(&system, "<|/tool|>");
    }
    puts_(&prompt, "<|system|>"); putb(&prompt, &system); puts_(&prompt, "<|end|>");
    puts_(&prompt, "<|user|>"); putb(&prompt, &user); puts_(&prompt, "<|end|>");
    puts_(&prompt, "<|assistant|>");

    puts_(&out, "{\"messages\":[{\"role\":\"system\",\"content\":");
    jsonstr(&out, system.b, system.n, 0);
    puts_(&out, "},{\"role\":\"user\",\"content\":");
    jsonstr(&out, user.b, user.n, 0);
    puts_(&out, "}],\"prompt\":");
    jsonstr(&out, prompt.b, prompt.n, 0);
    puts_(&out, ",\"params\":{\"stop\":[\"<|end|>\"],\"temperature\":0.2}}\n");
    emit(&out);
}

/* ---- the parser of the model's output ---- */

/* find is the first occurrence of needle in s[from:n], or -1. */
static long find(const char *s, size_t n, size_t from, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = from; i + m <= n; i++)
        if (!memcmp(s + i, needle, m)) return (long)i;
    return -1;
}

/* calls reads a <|tool_call|> block as the Go builder does: a JSON list of objects, each with a
 * string "name" that is not empty (and any "arguments"); NULL when it is not one. */
static jv *calls(const char *s, size_t n) {
    parser ps = {s, s + n, 0};
    jv *v = value(&ps);
    ws(&ps);
    if (!v || ps.p != ps.end || v->t != J_ARR) return NULL;
    for (size_t i = 0; i < v->n; i++) {
        jv *c = v->items[i];
        if (c->t != J_OBJ) return NULL;
        jv *name = get(c, "name");
        if (!name || name->t != J_STR || name->s.n == 0) return NULL;
    }
    return v;
}

static void trim(const char **s, size_t *n) {
    while (*n > 0 && strchr(" \t\n\r\v\f", **s)) { (*s)++; (*n)--; }
    while (*n > 0 && strchr(" \t\n\r\v\f", (*s)[*n - 1])) (*n)--;
}

static void parse(jv *req) {
    jv *output = get(req, "output");
    const char *s = output && output->t == J_STR && output->s.b ? output->s.b : "";
    size_t n = output && output->t == J_STR ? output->s.n : 0;
    const char *open = "<|tool_call|>", *end = "<|/tool_call|>";
    buf answer = {0}, reqs = {0}, out = {0};
    size_t count = 0, rest = 0;
    for (;;) {
        long i = find(s, n, rest, open);
        if (i < 0) break;
        long j = find(s, n, (size_t)i, end);
        if (j < 0) break;
        size_t bs = (size_t)i + strlen(open), after = (size_t)j + strlen(end);
        jv *list = calls(s + bs, (size_t)j - bs);
        if (!list) {
            put(&answer, s + rest, after - rest);
        } else {
            put(&answer, s + rest, (size_t)i - rest);
            for (size_t k = 0; k < list->n; k++) {
                if (count++) puts_(&reqs, ",");
                puts_(&reqs, "{\"name\":");
                jv *name = get(list->items[k], "name");
                jsonstr(&reqs, name->s.b, name->s.n, 0);
                puts_(&reqs, ",\"arguments\":");
                jv *args = get(list->items[k], "arguments");
                if (args) {
                    buf a = {0};
                    marshal(&a, args, 0); /* as the Go builder's answer holds it: decoded, written again */
                    putb(&reqs, &a);
                } else puts_(&reqs, "null");
                puts_(&reqs, "}");
            }
        }
        rest = after;
    }
    put(&answer, s + rest, n - rest);
    const char *a = answer.b ? answer.b : "";
    size_t an = answer.n;
    trim(&a, &an);
    if (an >= 7 && !memcmp(a + an - 7, "<|end|>", 7)) an -= 7;
    trim(&a, &an);
    puts_(&out, "{\"final_answer\":");
    jsonstr(&out, a, an, 0);
    puts_(&out, ",\"tool_requests\":[");
    putb(&out, &reqs);
    puts_(&out, "]}\n");
    emit(&out);
}

/* run answers the request on stdin; it fails (exit status 1, the reason on stderr) otherwise. */
static int run(void) {
    buf in = {0};
    static char chunk[65536]; /* not on the stack, which is 64 KiB in all */
    ssize_t n;
    while ((n = read(0, chunk, sizeof chunk)) > 0) put(&in, chunk, (size_t)n);
    if (n < 0) fail("reading stdin failed");
    parser ps = {in.b ? in.b : "", (in.b ? in.b : "") + in.n, 0};
    jv *req = value(&ps);
    if (!req || req->t != J_OBJ) fail("the input is not a JSON object");
    jv *op = get(req, "op");
    if (op && op->t == J_STR && op->s.n == 5 && !memcmp(op->s.b, "build", 5)) build(req);
    else if (op && op->t == J_STR && op->s.n == 5 && !memcmp(op->s.b, "parse", 5)) parse(req);
    else fail("unknown op");
    return 0;
}

/* The builder as a command: its runtime starts in every call. */
int main(void) { return run(); }

/* The builder as a reactor (-mexec-model=reactor): each call of the host. */
__attribute__((export_name("podium_run"))) int podium_run(void) { return run(); }
