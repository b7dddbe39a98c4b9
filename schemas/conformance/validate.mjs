// Validates event bodies with ajv, as a JavaScript client would: JSON Schema 2020-12 with
// ajv-formats' formats (date-time, uri-reference) asserted. Reads one JSON object a line on stdin,
// {"type": "<event type>", "body": "<the body as text>"}, and writes one line a case,
// {"valid": true|false, "error": "..."}. The schemas are ../events/<type>.schema.json.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const ajv = new Ajv2020({ strict: false, allErrors: false });
addFormats(ajv);
const validators = new Map();
function validator(type) {
  if (!validators.has(type)) {
    const schema = JSON.parse(readFileSync(new URL(`../events/${type}.schema.json`, import.meta.url), "utf8"));
    validators.set(type, ajv.compile(schema));
  }
  return validators.get(type);
}

const out = [];
for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  let doc;
  try {
    doc = JSON.parse(c.body);
  } catch (e) {
    out.push(JSON.stringify({ valid: false, error: "not JSON: " + e.message }));
    continue;
  }
  const validate = validator(c.type);
  const valid = validate(doc);
  out.push(JSON.stringify({ valid, error: valid ? "" : ajv.errorsText(validate.errors) }));
}
process.stdout.write(out.join("\n") + "\n");
