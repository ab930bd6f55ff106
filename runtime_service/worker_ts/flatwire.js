// The flat lossless-JSON token wire, JavaScript side (runtime_service/worker/flatwire.py is the
// other; tests/runtime/wire_vectors.jsonl holds the cases both must agree on).
//
// A value travels as one flat list of tokens in pre-order: scalars are the leaf itself,
// `{"kind":"array","length":n}` is followed by the n element encodings, and
// `{"kind":"object","keys":[...]}` by the n member encodings. A lone `{"kind":"json","text":t}`
// token carries a whole value as JSON text (the runtime sends large plain values so).
// Encoding, decoding, spelling and parsing are all iterative: depth is bounded by memory only.
//
// Numbers: JSON has one number type, Python two. A JavaScript number that is a safe integer
// (|n| <= 2^53 - 1) is spelled as an integer, any other as Python spells that float (`repr`),
// so it comes back as the same double. An integer beyond the safe range arrives as a BigInt
// and a BigInt goes out as its exact digits: nothing is ever rounded on the way.

import { types } from 'node:util';
import {
  ArrayIsArray,
  ArrayPrototype,
  BigIntCtor,
  BigIntPrototypeToString,
  JSONStringify,
  MathAbs,
  NumberIsFinite,
  NumberIsSafeInteger,
  NumberPrototypeToExponential,
  NumberPrototypeToString,
  ObjectGetOwnPropertyDescriptor,
  ObjectGetPrototypeOf,
  ObjectIs,
  ObjectPrototype,
  ObjectSetPrototypeOf,
  ReflectApply,
  ReflectOwnKeys,
  RegExpPrototypeExec,
  SafeSet,
  SetPrototypeAdd,
  SetPrototypeDelete,
  SetPrototypeHas,
  StringCtor,
  StringPrototypeCharCodeAt,
  StringPrototypeIndexOf,
  StringPrototypeRepeat,
  StringPrototypeSlice,
  SymbolPrototypeToString,
  bareArray,
  NumberCtor,
  NumberParseInt,
  StringFromCharCode,
} from './intrinsics.js';

/** The longest integer the channel carries (the runtime's `int_max_str_digits`). */
export const MAX_INT_DIGITS = 4300;
/** A json token's text may nest at most this deep (flatwire_fast.FAST_DEPTH). */
export const FAST_DEPTH = 100;

/** A value is not lossless JSON, or a token list is not a valid encoding. */
export class WireError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'WireError';
  }
}

/** JSON text holds an integer of more than MAX_INT_DIGITS digits. */
export class IntegerTooLong extends WireError {
  constructor() {
    super(
      `an integer has more than ${MAX_INT_DIGITS} digits, the most the runtime's ` +
        'channel carries (send it as a string)',
    );
  }
}

const isProxy = types.isProxy;
/** @type {[(value: any) => boolean, string][]} */
const EXOTIC = [
  [types.isDate, 'Date'],
  [types.isMap, 'Map'],
  [types.isSet, 'Set'],
  [types.isWeakMap, 'WeakMap'],
  [types.isWeakSet, 'WeakSet'],
  [types.isRegExp, 'RegExp'],
  [types.isPromise, 'Promise'],
  [types.isBoxedPrimitive, 'boxed primitive'],
  [types.isArrayBufferView, 'ArrayBufferView'],
  [types.isAnyArrayBuffer, 'ArrayBuffer'],
  [types.isNativeError, 'Error'],
  [types.isModuleNamespaceObject, 'module namespace'],
  [types.isGeneratorObject, 'generator'],
  [types.isExternal, 'external'],
];

/**
 * What a rejected object is called in an error text: its class's own name where it has one
 * (read through data properties only, so no program getter runs), else what it is.
 * @param {object} value
 */
function exoticName(value) {
  let proto = null;
  try {
    proto = ObjectGetPrototypeOf(value);
    const ctor = proto === null ? undefined : ObjectGetOwnPropertyDescriptor(proto, 'constructor');
    if (ctor !== undefined && 'value' in ctor && typeof ctor.value === 'function') {
      const name = ObjectGetOwnPropertyDescriptor(ctor.value, 'name');
      if (name !== undefined && typeof name.value === 'string' && name.value !== '') {
        if (name.value !== 'Object' && name.value !== 'Array') return name.value;
      }
    }
  } catch {
    // a revoked proxy and the like: fall through
  }
  for (const [test, name] of EXOTIC) {
    if (test(value)) return name;
  }
  return 'object';
}

/**
 * A short, safe rendering of what a getter threw.
 * @param {unknown} error
 */
function describeThrown(error) {
  try {
    if (typeof error === 'object' && error !== null) {
      const message = ObjectGetOwnPropertyDescriptor(error, 'message');
      if (message !== undefined && typeof message.value === 'string') return message.value;
    }
    return typeof error === 'symbol' ? SymbolPrototypeToString(error) : StringCtor(error);
  } catch {
    return 'an unrenderable value';
  }
}

/** @param {string | symbol} key */
function keyText(key) {
  return typeof key === 'symbol' ? SymbolPrototypeToString(key) : JSONStringify(key);
}

/**
 * One property's value, read exactly once (a getter runs once; what it throws is a WireError).
 * @param {any} holder
 * @param {string} key
 * @param {PropertyDescriptor} desc
 */
function readProperty(holder, key, desc) {
  if (!desc.enumerable) throw new WireError(`object property ${keyText(key)} is not enumerable`);
  if ('value' in desc) return desc.value;
  if (desc.get === undefined) return undefined;
  try {
    return ReflectApply(desc.get, holder, []);
  } catch (error) {
    throw new WireError(`reading property ${keyText(key)} threw: ${describeThrown(error)}`);
  }
}

/** @param {number} value */
function checkNumber(value) {
  if (!NumberIsFinite(value)) {
    throw new WireError(`${value !== value ? 'nan' : value > 0 ? 'inf' : '-inf'} is not a finite number`);
  }
  if (value === 0 && ObjectIs(value, -0)) {
    throw new WireError('-0.0 cannot round-trip through JSON');
  }
}

/** @param {bigint} value */
function checkBigInt(value) {
  const digits = BigIntPrototypeToString(value).length - (value < 0n ? 1 : 0);
  if (digits > MAX_INT_DIGITS) throw new IntegerTooLong();
}

/**
 * Validate `value` as lossless JSON and return its flat token list (a snapshot: every
 * property is read once, and nothing in the result is shared with the value).
 *
 * Accepted: null, booleans, strings, finite numbers other than -0, BigInts of at most
 * MAX_INT_DIGITS digits, dense arrays with the intrinsic prototype and no other own
 * properties, and objects whose prototype is null or the intrinsic Object.prototype with only
 * enumerable string keys. A container that is its own ancestor is a cycle; one reached twice
 * through different paths is copied twice.
 * @param {unknown} value
 * @returns {any[]}
 */
export function encode(value) {
  const tokens = bareArray();
  /** @type {any[][]} */
  const stack = bareArray(); // frames: [children, next index, container]
  const onPath = new SafeSet();
  let pending = value;
  let havePending = true;
  for (;;) {
    if (havePending) {
      havePending = false;
      const item = pending;
      switch (typeof item) {
        case 'string':
        case 'boolean':
          tokens[tokens.length] = item;
          break;
        case 'number':
          checkNumber(item);
          tokens[tokens.length] = item;
          break;
        case 'bigint':
          checkBigInt(item);
          tokens[tokens.length] = item;
          break;
        case 'object': {
          if (item === null) {
            tokens[tokens.length] = null;
            break;
          }
          if (isProxy(item)) throw new WireError('Proxy is not a JSON value');
          if (SetPrototypeHas(onPath, item)) throw new WireError('value contains a cycle');
          const children = ArrayIsArray(item) ? arrayChildren(item) : objectChildren(item);
          if (children.length) {
            SetPrototypeAdd(onPath, item);
            stack[stack.length] = [children, 0, item];
          }
          break;
        }
        default:
          throw new WireError(`${typeof item} is not a JSON value`);
      }
    }
    if (stack.length === 0) return tokens;
    const frame = stack[stack.length - 1];
    const children = frame[0];
    if (frame[1] < children.length) {
      pending = children[frame[1]++];
      havePending = true;
    } else {
      stack.length -= 1;
      SetPrototypeDelete(onPath, frame[2]);
    }
  }

  /** @param {any[]} list */
  function arrayChildren(list) {
    if (ObjectGetPrototypeOf(list) !== ArrayPrototype) {
      throw new WireError(`${exoticName(list)} is not a JSON value`);
    }
    const length = list.length;
    const children = bareArray();
    for (let index = 0; index < length; index++) {
      const desc = ObjectGetOwnPropertyDescriptor(list, index);
      if (desc === undefined) {
        throw new WireError(`sparse array (no element at index ${index}) is not a JSON value`);
      }
      children[index] = readProperty(list, StringCtor(index), desc);
    }
    const keys = ReflectOwnKeys(list);
    if (keys.length !== length + 1) {
      for (const key of keys) {
        if (typeof key === 'symbol') throw new WireError(`object key ${keyText(key)} is not a string`);
        if (key !== 'length' && !(StringCtor(+key) === key && +key < length)) {
          throw new WireError(`array has a property other than its elements: ${keyText(key)}`);
        }
      }
    }
    tokens[tokens.length] = { __proto__: null, kind: 'array', length };
    return children;
  }

  /** @param {object} obj */
  function objectChildren(obj) {
    const proto = ObjectGetPrototypeOf(obj);
    if (proto !== null && proto !== ObjectPrototype) {
      throw new WireError(`${exoticName(obj)} is not a JSON value`);
    }
    for (const [test, name] of EXOTIC) {
      if (test(obj)) throw new WireError(`${name} is not a JSON value`);
    }
    const ownKeys = ReflectOwnKeys(obj);
    const keys = bareArray();
    const children = bareArray();
    for (let index = 0; index < ownKeys.length; index++) {
      const key = ownKeys[index];
      if (typeof key === 'symbol') throw new WireError(`object key ${keyText(key)} is not a string`);
      const desc = ObjectGetOwnPropertyDescriptor(obj, key);
      if (desc === undefined) continue; // deleted by a getter read earlier
      children[children.length] = readProperty(obj, key, desc);
      keys[keys.length] = key;
    }
    tokens[tokens.length] = { __proto__: null, kind: 'object', keys };
    return children;
  }
}

const NEG_ZERO_MESSAGE = 'negative zero (-0) cannot round-trip through JSON';

/** @param {unknown} token */
function isValidScalar(token) {
  switch (typeof token) {
    case 'string':
    case 'boolean':
    case 'bigint':
      return true;
    case 'number':
      return NumberIsFinite(token) && !(token === 0 && ObjectIs(token, -0));
    case 'object':
      return token === null;
    default:
      return false;
  }
}

/** @param {unknown} token */
function pythonTypeName(token) {
  if (ArrayIsArray(token)) return 'list';
  if (typeof token === 'number') return 'float'; // non-finite: what Python reads it as
  if (typeof token === 'object') return token === null ? 'NoneType' : 'dict';
  return typeof token;
}

/**
 * The own keys of a marker token, if it is a plain object; else null.
 * @param {unknown} token
 */
function markerKeys(token) {
  if (typeof token !== 'object' || token === null || ArrayIsArray(token)) return null;
  const proto = ObjectGetPrototypeOf(token);
  if (proto !== null && proto !== ObjectPrototype) return null;
  return ReflectOwnKeys(token);
}

/**
 * @param {any} marker
 * @param {string} key
 */
function ownValue(marker, key) {
  const desc = ObjectGetOwnPropertyDescriptor(marker, key);
  return desc === undefined ? undefined : desc.value;
}

/**
 * Rebuild the value `tokens` encodes; throws WireError for any invalid encoding.
 * @param {unknown} tokens
 * @returns {unknown}
 */
export function decode(tokens) {
  if (ArrayIsArray(tokens) && tokens.length === 1) {
    const token = tokens[0];
    if (isValidScalar(token)) return token;
    const keys = markerKeys(token);
    if (keys !== null && ownValue(token, 'kind') === 'json') return decodeJsonToken(token, keys);
  }
  return decodeTree(tokens);
}

/**
 * @param {any} marker
 * @param {(string | symbol)[]} keys
 */
function decodeJsonToken(marker, keys) {
  const text = ownValue(marker, 'text');
  if (keys.length !== 2 || typeof text !== 'string') throw new WireError('invalid marker token');
  const value = parseJson(text, FAST_DEPTH);
  // Checked as tokens, for the token path's errors (-0, non-finite numbers).
  return decodeTree(tokensOf(value));
}

/**
 * The token list of a parsed value, unchecked (decodeTree checks it).
 * @param {unknown} value
 */
function tokensOf(value) {
  const tokens = bareArray();
  /** @type {any[]} */
  const stack = bareArray();
  let pending = value;
  let havePending = true;
  for (;;) {
    if (havePending) {
      havePending = false;
      const item = pending;
      if (ArrayIsArray(item)) {
        tokens[tokens.length] = { __proto__: null, kind: 'array', length: item.length };
        if (item.length) stack[stack.length] = [item, 0];
      } else if (typeof item === 'object' && item !== null) {
        const keys = ReflectOwnKeys(item);
        tokens[tokens.length] = { __proto__: null, kind: 'object', keys };
        const values = bareArray();
        for (let i = 0; i < keys.length; i++) values[i] = /** @type {any} */ (item)[keys[i]];
        if (values.length) stack[stack.length] = [values, 0];
      } else {
        tokens[tokens.length] = item;
      }
    }
    if (stack.length === 0) return tokens;
    const frame = stack[stack.length - 1];
    if (frame[1] < frame[0].length) {
      pending = frame[0][frame[1]++];
      havePending = true;
    } else {
      stack.length -= 1;
    }
  }
}

/**
 * The token path of `decode`. Rejected: a non-list or empty input, tokens that are neither
 * valid scalars nor markers, markers with any key set other than exactly {kind, length} /
 * {kind, keys}, unknown kinds, a length or key count larger than the tokens left, non-string
 * or duplicate keys, a second root, and incomplete input.
 * @param {unknown} tokens
 */
function decodeTree(tokens) {
  if (!ArrayIsArray(tokens) || tokens.length === 0) {
    throw new WireError('wire value must be a non-empty token list');
  }
  const total = tokens.length;
  // Open containers: [container, keys (null for arrays), children attached, children wanted].
  /** @type {any[][]} */
  const stack = bareArray();
  let root;
  let haveRoot = false;
  let index = 0;
  while (index < total) {
    const token = tokens[index];
    index += 1;
    const remaining = total - index;
    let value;
    /** @type {any[] | null} */
    let opened = null;
    if (isValidScalar(token)) {
      value = token;
    } else {
      const keys = markerKeys(token);
      if (keys !== null) {
        const kind = ownValue(token, 'kind');
        if (keys.length !== 2 || typeof kind !== 'string') throw new WireError('invalid marker token');
        if (kind === 'array' && ObjectGetOwnPropertyDescriptor(token, 'length') !== undefined) {
          const length = ownValue(token, 'length');
          if (!NumberIsSafeInteger(length) || length < 0 || length > remaining) {
            throw new WireError('array marker has an invalid length');
          }
          value = bareArray();
          if (length) opened = [value, null, 0, length];
          else ObjectSetPrototypeOf(value, ArrayPrototype);
        } else if (kind === 'object' && ObjectGetOwnPropertyDescriptor(token, 'keys') !== undefined) {
          const names = ownValue(token, 'keys');
          if (!ArrayIsArray(names) || names.length > remaining) {
            throw new WireError('object marker has invalid keys');
          }
          const seen = new SafeSet();
          for (let i = 0; i < names.length; i++) {
            if (typeof names[i] !== 'string') throw new WireError('object marker has a non-string key');
            SetPrototypeAdd(seen, names[i]);
          }
          if (seen.size !== names.length) throw new WireError('object marker has duplicate keys');
          value = { __proto__: null };
          if (names.length) opened = [value, names, 0, names.length];
          else ObjectSetPrototypeOf(value, ObjectPrototype);
        } else {
          throw new WireError('invalid marker token');
        }
      } else if (typeof token === 'number' && token === 0) {
        throw new WireError(NEG_ZERO_MESSAGE); // the only zero isValidScalar refuses
      } else {
        throw new WireError(`invalid token of type ${pythonTypeName(token)}`);
      }
    }

    if (stack.length) {
      const frame = stack[stack.length - 1];
      const slot = frame[2];
      // Containers are built without a prototype (so no setter a program put on one can
      // intercept an element, and "__proto__" is an ordinary key) and get it once complete.
      if (frame[1] === null) frame[0][slot] = value;
      else frame[0][frame[1][slot]] = value;
      frame[2] = slot + 1;
    } else if (haveRoot) {
      throw new WireError('extra tokens after the root value');
    } else {
      root = value;
      haveRoot = true;
    }

    if (opened !== null) {
      stack[stack.length] = opened;
    } else {
      while (stack.length && stack[stack.length - 1][2] === stack[stack.length - 1][3]) {
        const done = stack[stack.length - 1];
        ObjectSetPrototypeOf(done[0], done[1] === null ? ArrayPrototype : ObjectPrototype);
        stack.length -= 1;
      }
    }
  }
  if (stack.length) throw new WireError('incomplete token list');
  return root;
}

/**
 * An independent lossless-JSON copy of `value` (throws WireError).
 * @param {unknown} value
 */
export function snapshot(value) {
  return decode(encode(value));
}

// -- spelling ----------------------------------------------------------------------------

/**
 * How Python's `repr` spells a float: the shortest round-trip digits, in fixed notation for
 * decimal exponents -4..15 (with ".0" when integral), else d.ddde±XX.
 * @param {number} value finite
 */
export function pythonFloatRepr(value) {
  const negative = value < 0 || ObjectIs(value, -0);
  const text = NumberPrototypeToExponential(negative ? -value : value);
  const at = StringPrototypeIndexOf(text, 'e');
  const mantissa = StringPrototypeSlice(text, 0, at);
  const exp = +StringPrototypeSlice(text, at + 1);
  const digits = mantissa.length > 1 ? mantissa[0] + StringPrototypeSlice(mantissa, 2) : mantissa;
  let out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = '0.' + StringPrototypeRepeat('0', -exp - 1) + digits;
    } else if (digits.length <= exp + 1) {
      out = digits + StringPrototypeRepeat('0', exp + 1 - digits.length) + '.0';
    } else {
      out = StringPrototypeSlice(digits, 0, exp + 1) + '.' + StringPrototypeSlice(digits, exp + 1);
    }
  } else {
    const magnitude = MathAbs(exp);
    out =
      digits[0] +
      (digits.length > 1 ? '.' + StringPrototypeSlice(digits, 1) : '') +
      (exp < 0 ? 'e-' : 'e+') +
      (magnitude < 10 ? '0' : '') +
      NumberPrototypeToString(magnitude, 10);
  }
  return negative ? '-' + out : out;
}

/**
 * The JSON spelling of a number token: safe integers as integers, the rest as Python floats.
 * @param {number} value
 */
export function spellNumber(value) {
  return NumberIsSafeInteger(value) ? NumberPrototypeToString(value, 10) : pythonFloatRepr(value);
}

const NON_ASCII = /[\u007f-\uffff]/g; // as Python's ensure_ascii: DEL too
const HEX = '0123456789abcdef';

/**
 * A string as an ASCII JSON string literal, escaped as Python's json writes it.
 * @param {string} text
 */
export function spellString(text) {
  const quoted = JSONStringify(text);
  NON_ASCII.lastIndex = 0;
  let match = RegExpPrototypeExec(NON_ASCII, quoted);
  if (match === null) return quoted;
  let out = '';
  let from = 0;
  while (match !== null) {
    const at = match.index;
    const code = StringPrototypeCharCodeAt(quoted, at);
    out +=
      StringPrototypeSlice(quoted, from, at) +
      '\\u' +
      HEX[(code >> 12) & 15] +
      HEX[(code >> 8) & 15] +
      HEX[(code >> 4) & 15] +
      HEX[code & 15];
    from = at + 1;
    match = RegExpPrototypeExec(NON_ASCII, quoted);
  }
  return out + StringPrototypeSlice(quoted, from);
}

/**
 * The JSON spelling of a scalar token, as on the wire; null for a container's token.
 * @param {any} token
 * @returns {string | null}
 */
function spellScalar(token) {
  switch (typeof token) {
    case 'string':
      return spellString(token);
    case 'number':
      return spellNumber(token);
    case 'bigint':
      return BigIntPrototypeToString(token);
    case 'boolean':
      return token ? 'true' : 'false';
    default:
      return token === null ? 'null' : null;
  }
}

/**
 * The JSON text of a token list (compact ASCII, as the runtime's `framing.pack` writes it).
 * @param {any[]} tokens
 */
export function spellTokens(tokens) {
  let out = '[';
  for (let index = 0; index < tokens.length; index++) {
    if (index) out += ',';
    const token = tokens[index];
    const scalar = spellScalar(token);
    if (scalar !== null) {
      out += scalar;
    } else if (token.kind === 'array') {
      out += '{"kind":"array","length":' + NumberPrototypeToString(token.length, 10) + '}';
    } else {
      const keys = token.keys;
      out += '{"kind":"object","keys":[';
      for (let k = 0; k < keys.length; k++) out += (k ? ',' : '') + spellString(keys[k]);
      out += ']}';
    }
  }
  return out + ']';
}

/**
 * The compact JSON text of the value a token list encodes (numbers spelled as on the wire),
 * iteratively: a schema or a service's data as JSON text, whatever its depth.
 * @param {any[]} tokens
 * @param {number} [maxDepth] null instead for a value nested deeper than this
 * @returns {string | null}
 */
export function jsonOfTokens(tokens, maxDepth = Infinity) {
  return textOfTokens(tokens, maxDepth, spellString);
}

/**
 * `jsonOfTokens` with strings spelled by `spell` (keys and values).
 * @param {any[]} tokens
 * @param {number} maxDepth
 * @param {(text: string) => string} spell
 * @returns {string | null}
 */
function textOfTokens(tokens, maxDepth, spell) {
  let out = '';
  const stack = bareArray(); // open containers: [keys (null: an array), length, next index]
  for (let at = 0; at < tokens.length; at++) {
    const token = tokens[at];
    const top = stack.length ? stack[stack.length - 1] : null;
    if (top !== null) {
      if (top[2] > 0) out += ',';
      if (top[0] !== null) out += spell(top[0][top[2]]) + ':';
      top[2] += 1;
    }
    const scalar = typeof token === 'string' ? spell(token) : spellScalar(token);
    if (scalar !== null) {
      out += scalar;
    } else if (token.kind === 'array') {
      out += '[';
      stack[stack.length] = [null, token.length, 0];
    } else {
      out += '{';
      stack[stack.length] = [token.keys, token.keys.length, 0];
    }
    if (stack.length > maxDepth) return null;
    while (stack.length && stack[stack.length - 1][2] === stack[stack.length - 1][1]) {
      out += stack[stack.length - 1][0] === null ? ']' : '}';
      stack.length -= 1;
    }
  }
  return out;
}

/** Token lists at least this long travel as JSON text (a raw frame's body, core.js). */
const RAW_MIN_TOKENS = 16;

/**
 * The JSON text a value's token list travels as, beside its message in a raw frame: for a
 * value of at least RAW_MIN_TOKENS tokens nested at most FAST_DEPTH deep (the most a json
 * token's text may be); null for any other (its tokens are spelled inside the message).
 * Characters are themselves (spellUnicode), so the text is the one the runtime would spell.
 * The runtime reads the text as the json token it stands for, at C speed, where it would walk
 * the tokens in Python.
 * @param {any[]} tokens
 * @returns {string | null}
 */
export function rawText(tokens) {
  return tokens.length < RAW_MIN_TOKENS ? null : textOfTokens(tokens, FAST_DEPTH, spellUnicode);
}

/**
 * A string as the runtime spells it canonically (Python's json with ensure_ascii off, the
 * registry's jsonvalue.dumps): every character itself but the quote, the backslash, control
 * characters and lone surrogates, escaped -- exactly JSON.stringify's spelling. A raw frame's
 * body then is the text the runtime would write, in UTF-8 (core.js rawFrame).
 * @param {string} text
 */
function spellUnicode(text) {
  return JSONStringify(text);
}

// -- parsing -----------------------------------------------------------------------------

/**
 * Parse JSON text strictly and iteratively: NaN/Infinity literals, duplicate object keys,
 * raw control characters and trailing data are refused; an integer beyond the safe range is
 * a BigInt (more than MAX_INT_DIGITS digits: IntegerTooLong), `-0` stays -0 (the decoder
 * refuses it). Objects and arrays have the intrinsic prototypes, "__proto__" an ordinary key.
 * @param {string} text
 * @param {number} [maxDepth] nesting beyond this is refused (json tokens)
 * @returns {unknown}
 */
export function parseJson(text, maxDepth = Infinity) {
  const length = text.length;
  let pos = 0;
  /** @type {any[][]} */
  const stack = bareArray(); // [container, pending key (objects), isArray]
  let root;
  let haveRoot = false;

  /** @param {string} why */
  const fail = (why) => new WireError(`invalid JSON text: ${why} at position ${pos}`);
  const skipBlank = () => {
    while (pos < length) {
      const c = StringPrototypeCharCodeAt(text, pos);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) pos++;
      else break;
    }
  };

  const readString = () => {
    // at the opening quote
    pos++;
    let out = '';
    let from = pos;
    for (;;) {
      if (pos >= length) throw fail('unterminated string');
      const c = StringPrototypeCharCodeAt(text, pos);
      if (c === 0x22) {
        out += StringPrototypeSlice(text, from, pos);
        pos++;
        return out;
      }
      if (c < 0x20) throw fail('control character in string');
      if (c !== 0x5c) {
        pos++;
        continue;
      }
      out += StringPrototypeSlice(text, from, pos);
      const e = text[pos + 1];
      pos += 2;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const hex = StringPrototypeSlice(text, pos, pos + 4);
          if (hex.length !== 4 || RegExpPrototypeExec(/^[0-9a-fA-F]{4}$/, hex) === null) {
            throw fail('invalid \\u escape');
          }
          out += StringFromCharCode(NumberParseInt(hex, 16));
          pos += 4;
          break;
        }
        default:
          pos -= 2;
          throw fail('invalid escape');
      }
      from = pos;
    }
  };

  const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
  const readNumber = () => {
    NUMBER.lastIndex = pos;
    const match = RegExpPrototypeExec(NUMBER, text);
    if (match === null) throw fail('invalid number');
    const spelled = match[0];
    pos += spelled.length;
    if (match[1] === undefined && match[2] === undefined) {
      const digits = spelled.length - (spelled[0] === '-' ? 1 : 0);
      if (digits > MAX_INT_DIGITS) throw new IntegerTooLong();
      if (digits < 16) return +spelled; // -0 stays -0
      const big = BigIntCtor(spelled);
      const small = NumberCtor(big);
      return NumberIsSafeInteger(small) ? small : big;
    }
    return +spelled;
  };

  for (;;) {
    skipBlank();
    if (pos >= length) throw fail('unexpected end');
    const top = stack.length ? stack[stack.length - 1] : null;
    let c = text[pos];
    // Inside a container: its separators, keys and end.
    if (top !== null) {
      const container = top[0];
      const isArray = top[2];
      const empty = top[3] === 0;
      if (c === (isArray ? ']' : '}')) {
        if (top[4]) throw fail('expected a value after a comma');
        pos++;
        stack.length -= 1;
        ObjectSetPrototypeOf(container, isArray ? ArrayPrototype : ObjectPrototype);
        if (stack.length === 0) break;
        continue;
      }
      if (!empty && !top[4]) {
        if (c !== ',') throw fail(`expected ',' or '${isArray ? ']' : '}'}'`);
        pos++;
        top[4] = true;
        skipBlank();
        c = text[pos];
      }
      if (!isArray) {
        if (c !== '"') throw fail('expected a property name');
        const key = readString();
        if (key in container) throw new WireError('duplicate key in JSON object');
        skipBlank();
        if (text[pos] !== ':') throw fail("expected ':'");
        pos++;
        skipBlank();
        top[1] = key;
        c = text[pos];
      }
    }
    let value;
    let opened = null;
    if (c === '{' || c === '[') {
      if (stack.length >= maxDepth) {
        throw new WireError(`json token text is nested deeper than ${maxDepth} levels`);
      }
      pos++;
      value = c === '[' ? bareArray() : { __proto__: null };
      opened = [value, null, c === '[', 0, false];
    } else if (c === '"') {
      value = readString();
    } else if (c === 't' && StringPrototypeSlice(text, pos, pos + 4) === 'true') {
      value = true;
      pos += 4;
    } else if (c === 'f' && StringPrototypeSlice(text, pos, pos + 5) === 'false') {
      value = false;
      pos += 5;
    } else if (c === 'n' && StringPrototypeSlice(text, pos, pos + 4) === 'null') {
      value = null;
      pos += 4;
    } else if (c === 'N' && StringPrototypeSlice(text, pos, pos + 3) === 'NaN') {
      throw new WireError('NaN is not valid JSON');
    } else if (c === 'I' && StringPrototypeSlice(text, pos, pos + 8) === 'Infinity') {
      throw new WireError('Infinity is not valid JSON');
    } else if (c === '-' && StringPrototypeSlice(text, pos, pos + 9) === '-Infinity') {
      throw new WireError('-Infinity is not valid JSON');
    } else if (c === '-' || (c >= '0' && c <= '9')) {
      value = readNumber();
    } else {
      throw fail('expected a value');
    }
    if (top !== null) {
      if (top[2]) top[0][top[3]] = value;
      else top[0][top[1]] = value;
      top[3] += 1;
      top[4] = false;
    } else {
      root = value;
      haveRoot = true;
    }
    if (opened !== null) {
      stack[stack.length] = opened;
    } else if (top === null) {
      break;
    }
  }
  if (!haveRoot && stack.length) throw fail('unexpected end');
  skipBlank();
  if (pos < length) throw fail('extra data');
  return root;
}
