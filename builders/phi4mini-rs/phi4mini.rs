// phi4mini.rs: Podium's example prompt builder for Phi-4-mini (docs/builders.md), in Rust with the
// standard library alone: the same builder as builders/phi4mini (Go) and builders/phi4mini-c,
// answering the same bytes on the same input. It reads one JSON request on stdin
// ({"op":"build",...} or {"op":"parse",...}) and writes one JSON answer on stdout, as
// encoding/json writes the Go builder's (keys in order, HTML left unescaped in the answer, the
// tools block and tool arguments as json.Marshal writes them).
//
// No crate: serde_json writes numbers and escapes strings otherwise than encoding/json, and the
// answer must be the Go builder's to the byte. Build it with Debian's rustc and its wasm32 standard
// library (packages rustc, libstd-rust-dev-wasm32; build.sh) as a reactor, whose runtime starts
// once per module (the way to serve it: podium_run is each call; wasi-libc's crt1-reactor.o gives
// it the _initialize that rustc 1.63 does not):
//
//   rustc --edition 2021 --target wasm32-wasi --crate-type cdylib -C opt-level=2 -C strip=symbols \
//     -C link-arg=$(rustc --print sysroot)/lib/rustlib/wasm32-wasi/lib/self-contained/crt1-reactor.o \
//     -o phi4mini.wasm phi4mini.rs
//
// or as a command (main is each call) without --crate-type and the link argument.

use std::io::{self, Read, Write};
use std::process;

// ---- JSON values ----

#[derive(Clone)]
enum Value {
    Null,
    Bool(bool),
    Num(f64),
    Str(Vec<u8>),
    Arr(Vec<Value>),
    // an object's keys and values in the order read (a key may repeat: the last one counts)
    Obj(Vec<(Vec<u8>, Value)>),
}

impl Value {
    // get is an object's value of key (the last one, as encoding/json keeps in a map); None when
    // absent.
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Obj(fields) => fields.iter().rev().find(|(k, _)| k.as_slice() == key.as_bytes()).map(|(_, v)| v),
            _ => None,
        }
    }

    // field is every value of an object's key as encoding/json matches a struct's field: the key
    // itself or any other case of it, in order.
    fn field(&self, key: &str) -> Vec<&Value> {
        match self {
            Value::Obj(fields) => fields.iter().filter(|(k, _)| folds_to(k, key)).map(|(_, v)| v).collect(),
            _ => Vec::new(),
        }
    }
}

// folds_to says whether a key is name (lower-case ASCII) in some case, as encoding/json folds a
// field's name: ASCII letters in either case, and the two other letters that fold to ASCII ones,
// the long s (U+017F) and the Kelvin sign (U+212A).
fn folds_to(key: &[u8], name: &str) -> bool {
    let key = match std::str::from_utf8(key) {
        Ok(k) => k,
        Err(_) => return false,
    };
    let folded = key.chars().map(|c| match c {
        '\u{17F}' => 's',
        '\u{212A}' => 'k',
        c => c.to_ascii_lowercase(),
    });
    folded.eq(name.chars())
}

// finite says whether every number in v is a float64: encoding/json fails on one past its range
// where it decodes the value (a map's, an interface's), not where it skips a key it has no field for.
fn finite(v: &Value) -> bool {
    match v {
        Value::Num(x) => x.is_finite(),
        Value::Arr(items) => items.iter().all(finite),
        Value::Obj(fields) => fields.iter().all(|(_, v)| finite(v)),
        _ => true,
    }
}

// A struct field as encoding/json decodes it from its keys: each in turn, a null leaving the field
// as it was, a value of another type failing the whole decoding (Err).

// string_field is a string field: the last string among its keys ("" for none).
fn string_field<'a>(values: &[&'a Value]) -> Result<&'a [u8], ()> {
    let mut out: &[u8] = b"";
    for v in values {
        match v {
            Value::Str(s) => out = s,
            Value::Null => {}
            _ => return Err(()),
        }
    }
    Ok(out)
}

// object_field is a map field: every key of its objects, one after another (decoding into the
// same map merges them: get finds the last).
// (a null sets the map to nil: what came before is dropped; a number past float64 in it fails).
fn object_field(values: &[&Value]) -> Result<Option<Value>, ()> {
    let mut merged: Option<Vec<(Vec<u8>, Value)>> = None;
    for v in values {
        match v {
            Value::Obj(fields) if finite(v) => merged.get_or_insert_with(Vec::new).extend(fields.iter().map(|(k, v)| (k.clone(), v.clone()))),
            Value::Null => merged = None,
            _ => return Err(()),
        }
    }
    Ok(merged.map(Value::Obj))
}

// get reads a key of an optional value, as a chain of lookups on objects that may be absent.
fn get<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    v.and_then(|v| v.get(key))
}

struct Parser<'a> {
    s: &'a [u8],
    p: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.p < self.s.len() && matches!(self.s[self.p], b' ' | b'\t' | b'\n' | b'\r') {
            self.p += 1;
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        if self.s.len() - self.p < 4 {
            return None;
        }
        let mut r = 0u32;
        for _ in 0..4 {
            let c = self.s[self.p];
            self.p += 1;
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return None,
            };
            r = r << 4 | d as u32;
        }
        Some(r)
    }

    fn string(&mut self) -> Option<Vec<u8>> {
        if self.p >= self.s.len() || self.s[self.p] != b'"' {
            return None;
        }
        self.p += 1;
        let mut o = Vec::new();
        while self.p < self.s.len() && self.s[self.p] != b'"' {
            let c = self.s[self.p];
            if c < 0x20 {
                return None;
            }
            if c != b'\\' {
                // a run of plain bytes at once: most of a context is text
                let run = self.p;
                while self.p < self.s.len() && self.s[self.p] != b'"' && self.s[self.p] != b'\\' && self.s[self.p] >= 0x20 {
                    self.p += 1;
                }
                o.extend_from_slice(&self.s[run..self.p]);
                continue;
            }
            self.p += 1;
            if self.p >= self.s.len() {
                return None;
            }
            let e = self.s[self.p];
            self.p += 1;
            match e {
                b'"' => o.push(b'"'),
                b'\\' => o.push(b'\\'),
                b'/' => o.push(b'/'),
                b'b' => o.push(8),
                b'f' => o.push(12),
                b'n' => o.push(b'\n'),
                b'r' => o.push(b'\r'),
                b't' => o.push(b'\t'),
                b'u' => {
                    let r = self.hex4()?;
                    if (0xD800..0xDC00).contains(&r) {
                        // a surrogate pair, or U+FFFD as encoding/json reads a lone one
                        let save = self.p;
                        if self.s.len() - self.p >= 6 && self.s[self.p] == b'\\' && self.s[self.p + 1] == b'u' {
                            self.p += 2;
                            if let Some(r2) = self.hex4() {
                                if (0xDC00..0xE000).contains(&r2) {
                                    utf8(&mut o, 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00));
                                    continue;
                                }
                            }
                        }
                        self.p = save;
                        utf8(&mut o, 0xFFFD);
                    } else if (0xDC00..0xE000).contains(&r) {
                        utf8(&mut o, 0xFFFD);
                    } else {
                        utf8(&mut o, r);
                    }
                }
                _ => return None,
            }
        }
        if self.p >= self.s.len() {
            return None;
        }
        self.p += 1;
        Some(o)
    }

    // number reads a JSON number, by the grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    fn number(&mut self) -> Option<f64> {
        let start = self.p;
        let digits = |p: &mut Parser| -> usize {
            let from = p.p;
            while p.p < p.s.len() && p.s[p.p].is_ascii_digit() {
                p.p += 1;
            }
            p.p - from
        };
        if self.s.get(self.p) == Some(&b'-') {
            self.p += 1;
        }
        if self.s.get(self.p) == Some(&b'0') {
            self.p += 1;
        } else if digits(self) == 0 {
            return None;
        }
        if self.s.get(self.p) == Some(&b'.') {
            self.p += 1;
            if digits(self) == 0 {
                return None;
            }
        }
        if matches!(self.s.get(self.p), Some(b'e') | Some(b'E')) {
            self.p += 1;
            if matches!(self.s.get(self.p), Some(b'+') | Some(b'-')) {
                self.p += 1;
            }
            if digits(self) == 0 {
                return None;
            }
        }
        // past float64's range: an infinity here, an error where a field decodes it (finite)
        std::str::from_utf8(&self.s[start..self.p]).ok()?.parse().ok()
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        self.depth += 1;
        if self.p >= self.s.len() || self.depth > 1000 {
            return None;
        }
        let s = self.s; // the input, apart from the parser's position
        let rest = &s[self.p..];
        let v = match rest[0] {
            b'{' | b'[' => {
                let obj = rest[0] == b'{';
                let close = if obj { b'}' } else { b']' };
                self.p += 1;
                self.ws();
                let mut fields = Vec::new();
                let mut items = Vec::new();
                if self.s.get(self.p) == Some(&close) {
                    self.p += 1;
                } else {
                    loop {
                        self.ws();
                        let mut key = Vec::new();
                        if obj {
                            key = self.string()?;
                            self.ws();
                            if self.s.get(self.p) != Some(&b':') {
                                return None;
                            }
                            self.p += 1;
                        }
                        let item = self.value()?;
                        if obj {
                            fields.push((key, item));
                        } else {
                            items.push(item);
                        }
                        self.ws();
                        match self.s.get(self.p) {
                            Some(b',') => self.p += 1,
                            Some(c) if *c == close => {
                                self.p += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                if obj {
                    Value::Obj(fields)
                } else {
                    Value::Arr(items)
                }
            }
            b'"' => Value::Str(self.string()?),
            _ if rest.starts_with(b"null") => {
                self.p += 4;
                Value::Null
            }
            _ if rest.starts_with(b"true") => {
                self.p += 4;
                Value::Bool(true)
            }
            _ if rest.starts_with(b"false") => {
                self.p += 5;
                Value::Bool(false)
            }
            b'-' | b'0'..=b'9' => Value::Num(self.number()?),
            _ => return None,
        };
        self.depth -= 1;
        Some(v)
    }
}

fn utf8(o: &mut Vec<u8>, r: u32) {
    let mut b = [0u8; 4];
    let c = char::from_u32(r).unwrap_or('\u{FFFD}');
    o.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
}

// ---- numbers as Go writes them ----

// json_num writes x as encoding/json does: the shortest digits that read back as x, in 'f' form,
// or 'e' below 1e-6 and from 1e21 (two exponent digits at least).
fn json_num(o: &mut Vec<u8>, x: f64) {
    if x == 0.0 {
        o.extend_from_slice(if x.is_sign_negative() { b"-0" } else { b"0" });
        return;
    }
    let abs = x.abs();
    if abs < 1e-6 || abs >= 1e21 {
        // Rust's {:e} is the shortest digits too: 1e21, 1.5e-7
        let s = format!("{:e}", x);
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        o.extend_from_slice(mantissa.as_bytes());
        // e-7, as encoding/json cleans up e-07; e+21
        let e = if exp < 0 { format!("e-{}", -exp) } else { format!("e+{:02}", exp) };
        o.extend_from_slice(e.as_bytes());
    } else {
        // and {} the shortest digits in 'f' form: 0.0000015, 123456789
        o.extend_from_slice(format!("{}", x).as_bytes());
    }
}

// ---- strings as encoding/json writes them ----

// decode reads one UTF-8 sequence at the start of s: its code point and length, or None when it is
// not valid (one byte used).
fn decode(s: &[u8]) -> Option<(u32, usize)> {
    let len = match s[0] {
        0x00..=0x7F => return Some((s[0] as u32, 1)),
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    if len > s.len() {
        return None;
    }
    std::str::from_utf8(&s[..len]).ok().and_then(|c| c.chars().next()).map(|c| (c as u32, len))
}

fn json_str(o: &mut Vec<u8>, s: &[u8], html: bool) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    o.push(b'"');
    let mut i = 0;
    while i < s.len() {
        // a run of bytes written as they are, at once
        let run = i;
        while i < s.len() && s[i] >= 0x20 && s[i] < 0x80 && s[i] != b'"' && s[i] != b'\\' && !(html && matches!(s[i], b'<' | b'>' | b'&')) {
            i += 1;
        }
        if i > run {
            o.extend_from_slice(&s[run..i]);
            continue;
        }
        let c = s[i];
        if c < 0x80 {
            i += 1;
            match c {
                b'"' => o.extend_from_slice(b"\\\""),
                b'\\' => o.extend_from_slice(b"\\\\"),
                8 => o.extend_from_slice(b"\\b"),
                12 => o.extend_from_slice(b"\\f"),
                b'\n' => o.extend_from_slice(b"\\n"),
                b'\r' => o.extend_from_slice(b"\\r"),
                b'\t' => o.extend_from_slice(b"\\t"),
                _ => o.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]),
            }
            continue;
        }
        match decode(&s[i..]) {
            None => {
                o.extend_from_slice(b"\\ufffd");
                i += 1;
            }
            Some((0x2028, n)) => {
                o.extend_from_slice(b"\\u2028");
                i += n;
            }
            Some((0x2029, n)) => {
                o.extend_from_slice(b"\\u2029");
                i += n;
            }
            Some((_, n)) => {
                o.extend_from_slice(&s[i..i + n]);
                i += n;
            }
        }
    }
    o.push(b'"');
}

// marshal writes v as encoding/json does: object keys sorted (each once, its last value); <, > and
// & escaped when html (as json.Marshal does), not otherwise (as the builder's answer's encoder does).
fn marshal(o: &mut Vec<u8>, v: &Value, html: bool) {
    match v {
        Value::Null => o.extend_from_slice(b"null"),
        Value::Bool(true) => o.extend_from_slice(b"true"),
        Value::Bool(false) => o.extend_from_slice(b"false"),
        Value::Num(x) => json_num(o, *x),
        Value::Str(s) => json_str(o, s, html),
        Value::Arr(items) => {
            o.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    o.push(b',');
                }
                marshal(o, item, html);
            }
            o.push(b']');
        }
        Value::Obj(fields) => {
            let mut keys: Vec<&Vec<u8>> = Vec::new();
            for (k, _) in fields {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            keys.sort();
            o.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    o.push(b',');
                }
                json_str(o, k, html);
                o.push(b':');
                let last = fields.iter().rev().find(|(f, _)| f == *k).map(|(_, v)| v).unwrap_or(&Value::Null);
                marshal(o, last, html);
            }
            o.push(b'}');
        }
    }
}

// str prints a context value as the Go builder's str: strings as they are, numbers with %.6f and
// the trailing zeros dropped, booleans as true or false, nothing as "".
fn str(o: &mut Vec<u8>, v: Option<&Value>) {
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Str(s)) => o.extend_from_slice(s),
        Some(Value::Bool(b)) => o.extend_from_slice(if *b { b"true" } else { b"false" }),
        Some(Value::Num(x)) => {
            let s = format!("{:.6}", x);
            let s = s.trim_end_matches('0');
            o.extend_from_slice(s.strip_suffix('.').unwrap_or(s).as_bytes());
        }
        // a list or an object: as fmt.Sprint would, its JSON here (no example's variable is one)
        Some(v) => marshal(o, v, true),
    }
}

fn is_true(v: Option<&Value>) -> bool {
    matches!(v, Some(Value::Bool(true)))
}

fn list(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Arr(items)) => items,
        _ => &[],
    }
}

// ---- the builder ----

fn build(context: Option<&Value>, vars: Option<&Value>) -> Vec<u8> {
    let c = context;
    let team = get(c, "team");
    let mut system = b"You are ".to_vec();
    str(&mut system, get(team, "name"));
    system.extend_from_slice(b" (team id ");
    str(&mut system, get(team, "id"));
    system.extend_from_slice(b"), one of several teams competing on the same task over several rounds. An evaluator scores every submission; the best score wins. Answer with your complete submission only.");

    let mut user = b"# Task\n".to_vec();
    str(&mut user, get(c, "user_prompt"));
    user.extend_from_slice(b"\n\n# Round\nRound ");
    str(&mut user, get(c, "round_number"));
    user.extend_from_slice(b". Current time: ");
    str(&mut user, get(c, "current_datetime"));
    user.push(b'\n');
    let history = list(get(c, "history"));
    if !history.is_empty() {
        user.extend_from_slice(b"\n# Your previous rounds\n");
        for r in history {
            let r = Some(r);
            user.extend_from_slice(b"\n## Round ");
            str(&mut user, get(r, "round_number"));
            user.extend_from_slice(b": ");
            str(&mut user, get(r, "score_text"));
            user.push(b'\n');
            let mut feedback = Vec::new();
            str(&mut feedback, get(r, "feedback"));
            if !feedback.is_empty() {
                user.extend_from_slice(b"Evaluator feedback: ");
                user.extend_from_slice(&feedback);
                user.push(b'\n');
            }
            user.extend_from_slice(b"Your submission:\n");
            str(&mut user, get(r, "preview"));
            user.push(b'\n');
        }
    }
    let board = list(get(c, "leaderboard"));
    if !board.is_empty() {
        user.extend_from_slice(b"\n# Leaderboard\n");
        for r in board {
            let r = Some(r);
            str(&mut user, get(r, "position"));
            user.extend_from_slice(b". ");
            str(&mut user, get(r, "team_name"));
            user.extend_from_slice(b": best ");
            str(&mut user, get(r, "best_score_text"));
            user.extend_from_slice(b" in round ");
            str(&mut user, get(r, "best_round"));
            if is_true(get(r, "is_self")) {
                user.extend_from_slice(b" <- your team");
            }
            user.push(b'\n');
        }
    }
    if !is_true(get(c, "is_first_round")) {
        user.extend_from_slice(b"\nKeep what scored well, fix what the evaluator criticised, and write your complete new submission for round ");
        str(&mut user, get(c, "round_number"));
        user.extend_from_slice(b".\n");
    }
    if let Some(tools) = get(vars, "tools") {
        if !list(Some(tools)).is_empty() {
            system.extend_from_slice(b"<|tool|>");
            marshal(&mut system, tools, true); // json.Marshal, as the Go builder's toolBlock
            system.extend_from_slice(b"<|/tool|>");
        }
    }
    let mut prompt = b"<|system|>".to_vec();
    prompt.extend_from_slice(&system);
    prompt.extend_from_slice(b"<|end|><|user|>");
    prompt.extend_from_slice(&user);
    prompt.extend_from_slice(b"<|end|><|assistant|>");

    let mut out = b"{\"messages\":[{\"role\":\"system\",\"content\":".to_vec();
    json_str(&mut out, &system, false);
    out.extend_from_slice(b"},{\"role\":\"user\",\"content\":");
    json_str(&mut out, &user, false);
    out.extend_from_slice(b"}],\"prompt\":");
    json_str(&mut out, &prompt, false);
    out.extend_from_slice(b",\"params\":{\"stop\":[\"<|end|>\"],\"temperature\":0.2}}\n");
    out
}

// ---- the parser of the model's output ----

fn find(s: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from > s.len() {
        return None;
    }
    s[from..].windows(needle.len()).position(|w| w == needle).map(|i| from + i)
}

// A tool call as the Go builder decodes it: its name, and its arguments (None: absent, null).
struct Call {
    name: Vec<u8>,
    arguments: Option<Value>,
}

// calls reads a <|tool_call|> block as the Go builder does (json.Unmarshal into a list of
// builder.ToolRequest): null (no call), or a list of objects, each with a string "name" that is
// not empty and any "arguments"; None when it is not one.
fn calls(s: &[u8]) -> Option<Vec<Call>> {
    let mut p = Parser { s, p: 0, depth: 0 };
    let v = p.value()?;
    p.ws();
    if p.p != s.len() {
        return None;
    }
    let items = match v {
        Value::Arr(items) => items,
        Value::Null => return Some(Vec::new()),
        _ => return None,
    };
    let mut out = Vec::new();
    for c in &items {
        if !matches!(c, Value::Obj(_)) {
            return None;
        }
        let name = string_field(&c.field("name")).ok()?;
        if name.is_empty() {
            return None;
        }
        let arguments = c.field("arguments").last().map(|v| (*v).clone());
        if !arguments.as_ref().map_or(true, finite) {
            return None;
        }
        out.push(Call { name: name.to_vec(), arguments });
    }
    Some(out)
}

// trim drops white space at both ends, as strings.TrimSpace does: Unicode's, in valid UTF-8 only.
fn trim(s: &[u8]) -> &[u8] {
    let space = |r: u32| char::from_u32(r).map_or(false, char::is_whitespace);
    let mut start = 0;
    while start < s.len() {
        match decode(&s[start..]) {
            Some((r, n)) if space(r) => start += n,
            _ => break,
        }
    }
    let mut end = s.len();
    while end > start {
        // the last sequence: back over at most three continuation bytes
        let mut from = end - 1;
        while from > start && end - from < 4 && s[from] & 0xC0 == 0x80 {
            from -= 1;
        }
        match decode(&s[from..end]) {
            Some((r, n)) if from + n == end && space(r) => end = from,
            _ => break,
        }
    }
    &s[start..end]
}

fn parse(s: &[u8]) -> Vec<u8> {
    let (open, end) = (&b"<|tool_call|>"[..], &b"<|/tool_call|>"[..]);
    let mut answer = Vec::new();
    let mut reqs = Vec::new();
    let mut count = 0;
    let mut rest = 0;
    while let Some(i) = find(s, rest, open) {
        let j = match find(s, i, end) {
            Some(j) => j,
            None => break,
        };
        let after = j + end.len();
        match calls(&s[i + open.len()..j]) {
            None => answer.extend_from_slice(&s[rest..after]),
            Some(list) => {
                answer.extend_from_slice(&s[rest..i]);
                for call in &list {
                    if count > 0 {
                        reqs.push(b',');
                    }
                    count += 1;
                    reqs.extend_from_slice(b"{\"name\":");
                    json_str(&mut reqs, &call.name, false);
                    reqs.extend_from_slice(b",\"arguments\":");
                    match &call.arguments {
                        // as the Go builder's answer holds it: decoded, written again
                        Some(args) => marshal(&mut reqs, args, false),
                        None => reqs.extend_from_slice(b"null"),
                    }
                    reqs.push(b'}');
                }
            }
        }
        rest = after;
    }
    answer.extend_from_slice(&s[rest..]);
    let mut a = trim(&answer);
    if a.ends_with(b"<|end|>") {
        a = &a[..a.len() - 7];
    }
    let a = trim(a);
    let mut out = b"{\"final_answer\":".to_vec();
    json_str(&mut out, a, false);
    out.extend_from_slice(b",\"tool_requests\":[");
    out.extend_from_slice(&reqs);
    out.extend_from_slice(b"]}\n");
    out
}

fn fail(why: &str) -> ! {
    eprintln!("{}", why);
    process::exit(1);
}

// The builder as a command: its runtime starts in every call.
#[allow(dead_code)] // not called in a reactor
fn main() {
    run();
}

// The builder as a reactor: each call of the host. A failure exits (fail), as a command's does.
#[no_mangle]
pub extern "C" fn podium_run() -> i32 {
    run();
    0
}

// run answers the request on stdin.
fn run() {
    let mut input = Vec::new();
    if io::stdin().read_to_end(&mut input).is_err() {
        fail("reading stdin failed");
    }
    let mut p = Parser { s: &input, p: 0, depth: 0 };
    let req = match p.value() {
        Some(v @ Value::Obj(_)) => v,
        _ => fail("the input is not a JSON object"),
    };
    p.ws();
    // The fields of the Go builder's request, as encoding/json decodes them into its struct.
    let fields = (|| {
        string_field(&req.field("model"))?;
        Ok::<_, ()>((string_field(&req.field("op"))?, object_field(&req.field("context"))?, object_field(&req.field("vars"))?, string_field(&req.field("output"))?))
    })();
    let (op, context, vars, output) = match fields {
        Ok(f) if p.p == input.len() => f,
        _ => fail("the input is not the ABI's JSON"),
    };
    let out = match op {
        b"build" => build(context.as_ref(), vars.as_ref()),
        b"parse" => parse(output),
        _ => fail("unknown op"),
    };
    let mut stdout = io::stdout();
    if stdout.write_all(&out).is_err() || stdout.flush().is_err() {
        fail("writing the answer failed");
    }
}
