/**
 * Lossless JSON for the API's `*_json` text fields.
 *
 * `JSON.parse` rounds integers beyond ±(2^53−1) to the nearest double; the registry carries them
 * digit for digit. Here such integers become `bigint` (integers in the safe range stay `number`),
 * and `bigint` values are written back as their exact digits. Neither direction recurses on the
 * data: nesting depth is bounded by memory only (a 100,000-deep array is fine).
 *
 * Refused, in both directions (`JsonError`): NaN, ±Infinity, numbers that overflow a double,
 * negative zero in any spelling, duplicate object keys (parse), cycles and values that have no
 * faithful JSON spelling (serialize: `undefined` outside objects, functions, symbols, `Map`,
 * `Set`, class instances without `toJSON`).
 */

export type JsonValue = null | boolean | number | bigint | string | JsonValue[] | JsonObject;
export interface JsonObject {
  [key: string]: JsonValue;
}

export class JsonError extends Error {
  /** Offset in the text of the first problem (parse errors only). */
  readonly position: number | undefined;

  constructor(message: string, position?: number) {
    super(position === undefined ? message : `${message} at offset ${position}`);
    this.name = "JsonError";
    this.position = position;
  }
}

const hasOwn = Object.prototype.hasOwnProperty;
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const MIN_SAFE = -MAX_SAFE;

function setKey(obj: JsonObject, key: string, value: JsonValue): void {
  if (key === "__proto__") {
    Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
  } else {
    obj[key] = value;
  }
}

function isWs(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

/** Parses one JSON text. Integers outside the safe range become `bigint`. */
export function parseJson(text: string): JsonValue {
  const n = text.length;
  let i = 0;
  // Open containers, innermost last; `keys[k]` is the pending key of `stack[k]` when an object.
  const stack: (JsonValue[] | JsonObject)[] = [];
  const keys: string[] = [];
  const isArray: boolean[] = [];

  const fail = (message: string, at: number = i): never => {
    throw new JsonError(message, at);
  };
  const skipWs = (): void => {
    while (i < n && isWs(text.charCodeAt(i))) i++;
  };

  const parseString = (): string => {
    // text[i] is the opening quote.
    const open = i;
    i++;
    let start = i;
    let out = "";
    for (;;) {
      if (i >= n) fail("unterminated string", open);
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c === 0x5c) {
        out += text.slice(start, i);
        i++;
        if (i >= n) fail("unterminated string", open);
        const e = text.charCodeAt(i);
        switch (e) {
          case 0x22: out += '"'; break;
          case 0x5c: out += "\\"; break;
          case 0x2f: out += "/"; break;
          case 0x62: out += "\b"; break;
          case 0x66: out += "\f"; break;
          case 0x6e: out += "\n"; break;
          case 0x72: out += "\r"; break;
          case 0x74: out += "\t"; break;
          case 0x75: {
            const hex = text.slice(i + 1, i + 5);
            if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("invalid \\u escape", i - 1);
            out += String.fromCharCode(parseInt(hex, 16));
            i += 4;
            break;
          }
          default:
            fail("invalid escape", i - 1);
        }
        i++;
        start = i;
        continue;
      }
      if (c < 0x20) fail("control character in string");
      i++;
    }
  };

  const parseNumber = (): number | bigint => {
    const start = i;
    if (text.charCodeAt(i) === 0x2d) i++;
    if (i >= n || !isDigit(text.charCodeAt(i))) fail("invalid number", start);
    if (text.charCodeAt(i) === 0x30) {
      i++;
      if (i < n && isDigit(text.charCodeAt(i))) fail("leading zero in number", start);
    } else {
      while (i < n && isDigit(text.charCodeAt(i))) i++;
    }
    let integer = true;
    if (i < n && text.charCodeAt(i) === 0x2e) {
      integer = false;
      i++;
      if (i >= n || !isDigit(text.charCodeAt(i))) fail("invalid number", start);
      while (i < n && isDigit(text.charCodeAt(i))) i++;
    }
    if (i < n && (text.charCodeAt(i) | 0x20) === 0x65) {
      integer = false;
      i++;
      if (i < n && (text.charCodeAt(i) === 0x2b || text.charCodeAt(i) === 0x2d)) i++;
      if (i >= n || !isDigit(text.charCodeAt(i))) fail("invalid number", start);
      while (i < n && isDigit(text.charCodeAt(i))) i++;
    }
    const token = text.slice(start, i);
    if (integer) {
      // Up to 15 digits is always within the safe range.
      if (token.length <= 15) {
        const value = Number(token);
        if (Object.is(value, -0)) fail("negative zero (-0) cannot be represented losslessly", start);
        return value;
      }
      const big = BigInt(token);
      return big >= MIN_SAFE && big <= MAX_SAFE ? Number(big) : big;
    }
    const value = Number(token);
    if (!Number.isFinite(value)) fail(`number ${token.slice(0, 40)} overflows a 64-bit float`, start);
    if (Object.is(value, -0)) fail("negative zero (-0) cannot be represented losslessly", start);
    return value;
  };

  const literal = (word: string, value: JsonValue): JsonValue => {
    if (text.startsWith(word, i)) {
      i += word.length;
      return value;
    }
    return fail("unexpected character, expected a value");
  };

  // Reads `"key" :` of an object member; leaves i at the value.
  const readKey = (): void => {
    skipWs();
    if (text.charCodeAt(i) !== 0x22) fail("expected a string key");
    const keyAt = i;
    const key = parseString();
    const obj = stack[stack.length - 1] as JsonObject;
    if (hasOwn.call(obj, key)) fail(`duplicate object key ${JSON.stringify(key.slice(0, 40))}`, keyAt);
    keys[stack.length - 1] = key;
    skipWs();
    if (text.charCodeAt(i) !== 0x3a) fail("expected ':' after the object key");
    i++;
  };

  for (;;) {
    // Expect a value at i.
    skipWs();
    if (i >= n) fail("unexpected end of text, expected a value");
    const c = text.charCodeAt(i);
    let value: JsonValue;
    if (c === 0x7b) {
      i++;
      skipWs();
      if (text.charCodeAt(i) === 0x7d) {
        i++;
        value = {};
      } else {
        stack.push({});
        isArray.push(false);
        keys.push("");
        readKey();
        continue;
      }
    } else if (c === 0x5b) {
      i++;
      skipWs();
      if (text.charCodeAt(i) === 0x5d) {
        i++;
        value = [];
      } else {
        stack.push([]);
        isArray.push(true);
        keys.push("");
        continue;
      }
    } else if (c === 0x22) {
      value = parseString();
    } else if (c === 0x2d || isDigit(c)) {
      value = parseNumber();
    } else if (c === 0x74) {
      value = literal("true", true);
    } else if (c === 0x66) {
      value = literal("false", false);
    } else if (c === 0x6e) {
      value = literal("null", null);
    } else if (text.startsWith("NaN", i) || text.startsWith("Infinity", i)) {
      return fail("NaN and Infinity are not valid JSON (only finite numbers are)");
    } else {
      return fail("unexpected character, expected a value");
    }
    // A complete value: attach it, then close as many containers as the text closes.
    for (;;) {
      const depth = stack.length;
      if (depth === 0) {
        skipWs();
        if (i !== n) fail("unexpected data after the JSON value");
        return value;
      }
      const top = stack[depth - 1]!;
      const array = isArray[depth - 1]!;
      if (array) (top as JsonValue[]).push(value);
      else setKey(top as JsonObject, keys[depth - 1]!, value);
      skipWs();
      const p = text.charCodeAt(i);
      if (p === 0x2c) {
        i++;
        if (!array) readKey();
        break;
      }
      if (p === (array ? 0x5d : 0x7d)) {
        i++;
        value = top;
        stack.pop();
        isArray.pop();
        keys.pop();
        continue;
      }
      return fail(i >= n ? "unexpected end of text" : `expected ',' or '${array ? "]" : "}"}'`);
    }
  }
}

function isPlainObject(value: object): boolean {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function atom(value: unknown, where: () => string): string | undefined {
  switch (typeof value) {
    case "string":
      return JSON.stringify(value);
    case "number":
      if (!Number.isFinite(value)) throw new JsonError(`${value} is not valid JSON (at ${where()})`);
      if (Object.is(value, -0)) throw new JsonError(`negative zero cannot be represented losslessly (at ${where()})`);
      return String(value);
    case "bigint":
      return value.toString();
    case "boolean":
      return value ? "true" : "false";
    case "object":
      return value === null ? "null" : undefined;
    default:
      throw new JsonError(`a ${typeof value} is not a JSON value (at ${where()})`);
  }
}

/**
 * Serializes a value as compact JSON text. `bigint` is written as its exact digits; object
 * properties whose value is `undefined` are omitted (as `JSON.stringify` does); `toJSON()` is
 * honoured (e.g. `Date`).
 */
export function stringifyJson(value: unknown): string {
  const out: string[] = [];
  interface Frame {
    container: object;
    keys: string[] | null; // null: array
    index: number;
    wrote: boolean;
  }
  const stack: Frame[] = [];
  const active = new Set<object>();
  const where = (): string => {
    const parts = ["$"];
    for (const f of stack) {
      const at = f.index - 1;
      parts.push(f.keys === null ? `[${at}]` : `.${f.keys[at]}`);
    }
    return parts.join("");
  };

  let current: unknown = value;
  for (;;) {
    // Write `current` (or open it).
    if (current !== null && typeof current === "object" && typeof (current as { toJSON?: unknown }).toJSON === "function") {
      current = (current as { toJSON(): unknown }).toJSON();
    }
    if (current === undefined) throw new JsonError(`undefined is not a JSON value (at ${where()})`);
    const text = atom(current, where);
    if (text !== undefined) {
      out.push(text);
    } else {
      const obj = current as object;
      if (active.has(obj)) throw new JsonError(`cycle: a container is its own ancestor (at ${where()})`);
      if (Array.isArray(obj)) {
        out.push("[");
        stack.push({ container: obj, keys: null, index: 0, wrote: false });
      } else if (isPlainObject(obj)) {
        out.push("{");
        stack.push({ container: obj, keys: Object.keys(obj), index: 0, wrote: false });
      } else {
        const kind = (obj as { constructor?: { name?: string } }).constructor?.name ?? "object";
        throw new JsonError(`a ${kind} is not a JSON value (at ${where()})`);
      }
      active.add(obj);
    }
    // Find the next value to write, closing finished containers.
    let next: unknown = undefined;
    let found = false;
    while (stack.length > 0) {
      const f = stack[stack.length - 1]!;
      if (f.keys === null) {
        const arr = f.container as unknown[];
        if (f.index < arr.length) {
          if (f.wrote) out.push(",");
          f.wrote = true;
          next = arr[f.index++];
          found = true;
          break;
        }
        out.push("]");
      } else {
        const obj = f.container as Record<string, unknown>;
        while (f.index < f.keys.length && obj[f.keys[f.index]!] === undefined) f.index++;
        if (f.index < f.keys.length) {
          const key = f.keys[f.index]!;
          if (f.wrote) out.push(",");
          f.wrote = true;
          out.push(JSON.stringify(key), ":");
          next = obj[key];
          f.index++;
          found = true;
          break;
        }
        out.push("}");
      }
      active.delete(f.container);
      stack.pop();
    }
    if (!found) return out.join("");
    current = next;
  }
}

// ---------------------------------------------------------------------------------------------
// renderPrettyJson: the text `render_pretty` (codemode_wire/jsonvalue.py) writes
// ---------------------------------------------------------------------------------------------

/** Containers at depths 0-4 are pretty: their children sit at most 10 spaces in. */
const PRETTY_LEVELS = 5;

/** End (exclusive) of the string token whose opening quote is at `i`. */
function stringEnd(text: string, i: number): number {
  let j = i + 1;
  for (;;) {
    const c = text.charCodeAt(j);
    if (c === 0x22) return j + 1;
    j += c === 0x5c ? 2 : 1;
  }
}

/** End (exclusive) of the JSON value (container or scalar) that starts at `i`. */
function valueEnd(text: string, i: number): number {
  const c = text.charCodeAt(i);
  if (c === 0x22) return stringEnd(text, i);
  if (c !== 0x7b && c !== 0x5b) {
    let j = i;
    while (j < text.length && !",:]} \n\r\t".includes(text[j]!)) j++;
    return j;
  }
  let depth = 0;
  let j = i;
  for (;;) {
    const d = text.charCodeAt(j);
    if (d === 0x22) {
      j = stringEnd(text, j);
      continue;
    }
    if (d === 0x7b || d === 0x5b) depth++;
    else if (d === 0x7d || d === 0x5d) {
      depth--;
      if (depth === 0) return j + 1;
    }
    j++;
  }
}

/** `text[start:end]` without the whitespace between its tokens. */
function compact(text: string, start: number, end: number): string {
  const out: string[] = [];
  let from = start;
  let i = start;
  while (i < end) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      i = stringEnd(text, i);
    } else if (isWs(c)) {
      out.push(text.slice(from, i));
      while (i < end && isWs(text.charCodeAt(i))) i++;
      from = i;
    } else {
      i++;
    }
  }
  out.push(text.slice(from, end));
  return out.join("");
}

/**
 * What `render_pretty` writes for the value of the JSON text `text`: a string root as it is (no
 * quotes, no escaping); any other root indented by two spaces per level, the indentation capped
 * at 10 spaces (a container at depth 5 or deeper is written compact, as in `text`, on the line
 * where it starts); empty containers `[]`/`{}`; members `"key": value`.
 *
 * It works on the text, not on parsed values: a JavaScript number cannot tell `1.0` from `1` or
 * keep `1e+16`, which Python spells so. Every token is copied as `text` spells it, so `text`
 * must be the registry's `dumps` of the value (what every `*_json` field it writes holds): that
 * spelling is `render_pretty`'s. Throws `JsonError` for a text `parseJson` refuses.
 */
export function renderPrettyJson(text: string): string {
  const root = parseJson(text); // validates: the walk below trusts the syntax
  if (typeof root === "string") return root;
  const out: string[] = [];
  let depth = 0; // open pretty containers
  let i = 0;
  const n = text.length;
  while (i < n) {
    const c = text[i]!;
    switch (c) {
      case " ": case "\n": case "\r": case "\t":
        i++;
        break;
      case "{": case "[": {
        let j = i + 1;
        while (j < n && isWs(text.charCodeAt(j))) j++;
        const close = c === "{" ? "}" : "]";
        if (text[j] === close) {
          out.push(c + close);
          i = j + 1;
        } else if (depth >= PRETTY_LEVELS) {
          const end = valueEnd(text, i);
          out.push(compact(text, i, end));
          i = end;
        } else {
          depth++;
          out.push(c, "\n", "  ".repeat(depth));
          i = j;
        }
        break;
      }
      case "}": case "]":
        depth--;
        out.push("\n", "  ".repeat(depth), c);
        i++;
        break;
      case ",":
        out.push(",\n", "  ".repeat(depth));
        i++;
        break;
      case ":":
        out.push(": ");
        i++;
        break;
      default: {
        const end = valueEnd(text, i);
        out.push(text.slice(i, end));
        i = end;
      }
    }
  }
  return out.join("");
}

/**
 * The text of member `key` of the JSON object text `text`, as `text` spells it; undefined when
 * the object has no such member. `text` must be valid JSON (as `parseJson` accepts it).
 */
export function memberJson(text: string, key: string): string | undefined {
  let i = 0;
  const skip = (): void => {
    while (i < text.length && isWs(text.charCodeAt(i))) i++;
  };
  skip();
  if (text[i] !== "{") return undefined;
  i++;
  for (;;) {
    skip();
    if (text[i] !== '"') return undefined; // `}`: the end of the object
    const keyEnd = stringEnd(text, i);
    const name = JSON.parse(text.slice(i, keyEnd)) as string;
    i = keyEnd;
    skip();
    i++; // ':'
    skip();
    const end = valueEnd(text, i);
    if (name === key) return text.slice(i, end);
    i = end;
    skip();
    i++; // ',' or '}'
  }
}
