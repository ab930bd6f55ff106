// Exact byte accounting of a run's outer output, as
// runtime_service/worker/ledger.py counts it: the JSON encoding of the logs array ("[]" is 2,
// each entry its JSON-string size, one comma between entries) plus the JSON size of the
// completion value or the JSON-string size of the failure message; each log entry also costs
// LOG_LINE_OVERHEAD (what holding one more line costs the runtime and the registry whatever its
// text). The worker pre-checks with it so nothing over the cap crosses the channel; the runtime
// re-checks everything.

import {
  BigIntPrototypeToString,
  StringPrototypeCharCodeAt,
  StringPrototypeSlice,
  StringPrototypeToWellFormed,
} from './intrinsics.js';
import { spellNumber } from './flatwire.js';

/** "[]" for the logs plus '""' for the shortest message. */
export const MIN_OUTPUT_BYTES = 4;

/** Ledger bytes each log entry costs besides its JSON text: ledger.LOG_LINE_OVERHEAD. */
export const LOG_LINE_OVERHEAD = 32;

/**
 * `text` with each lone surrogate replaced by U+FFFD, as the runtime does (ledger.valid_text)
 * before it charges or relays any text: protobuf strings must be valid UTF-8.
 * @param {string} text
 */
export function validText(text) {
  return StringPrototypeToWellFormed(text);
}

/**
 * Bytes of the code point starting at `index`, in a JSON string literal; a surrogate pair
 * is one astral character (4 bytes) and its second half is then reported as 0.
 * @param {string} text
 * @param {number} index
 */
function charSize(text, index) {
  const code = StringPrototypeCharCodeAt(text, index);
  if (code < 0x80) {
    if (code < 0x20) {
      return code === 0x08 || code === 0x09 || code === 0x0a || code === 0x0c || code === 0x0d
        ? 2
        : 6;
    }
    return code === 0x22 || code === 0x5c ? 2 : 1;
  }
  if (code < 0x800) return 2;
  if (code >= 0xd800 && code <= 0xdbff) {
    const next = StringPrototypeCharCodeAt(text, index + 1);
    return next >= 0xdc00 && next <= 0xdfff ? 4 : 6;
  }
  if (code >= 0xdc00 && code <= 0xdfff) {
    const prev = index > 0 ? StringPrototypeCharCodeAt(text, index - 1) : 0;
    return prev >= 0xd800 && prev <= 0xdbff ? 0 : 6;
  }
  return 3;
}

/**
 * Bytes of `text` as a JSON string literal: quotes, escapes, UTF-8 for the rest.
 * @param {string} text
 */
export function jsonStringSize(text) {
  let size = 2;
  for (let index = 0; index < text.length; index++) size += charSize(text, index);
  return size;
}

/**
 * Longest code-point prefix of `text` whose JSON-string size is at most `budget`.
 * @param {string} text
 * @param {number} budget
 */
export function fitPrefix(text, budget) {
  let used = 2;
  let index = 0;
  while (index < text.length) {
    const step = charSize(text, index);
    const width = step === 4 ? 2 : 1;
    if (used + step > budget) break;
    used += step;
    index += width;
  }
  return index === text.length ? text : StringPrototypeSlice(text, 0, index);
}

/**
 * JSON size of the value a token list encodes, or `limit + 1` once it exceeds `limit`
 * (the walk stops there). Numbers count as they are spelled on the wire, which is how the
 * runtime spells them again.
 * @param {any[]} tokens
 * @param {number} limit
 */
export function tokensSize(tokens, limit) {
  let total = 0;
  for (let index = 0; index < tokens.length; index++) {
    const token = tokens[index];
    switch (typeof token) {
      case 'string':
        total += jsonStringSize(token);
        break;
      case 'number':
        total += spellNumber(token).length;
        break;
      case 'bigint':
        total += BigIntPrototypeToString(token).length;
        break;
      case 'boolean':
        total += token ? 4 : 5;
        break;
      default:
        if (token === null) {
          total += 4;
        } else if (token.kind === 'array') {
          total += 2 + (token.length > 1 ? token.length - 1 : 0);
        } else {
          const keys = token.keys;
          total += 2 + (keys.length > 1 ? keys.length - 1 : 0);
          for (let k = 0; k < keys.length; k++) total += jsonStringSize(keys[k]) + 1;
        }
    }
    if (total > limit) return limit + 1;
  }
  return total;
}

/** @param {number} maxBytes */
export function overflowMessage(maxBytes) {
  return `outer output exceeded ${maxBytes} bytes`;
}

/** Running count of the logs admitted so far against `maxBytes`. */
export class OutputLedger {
  /** @param {number} maxBytes */
  constructor(maxBytes) {
    if (!Number.isSafeInteger(maxBytes) || maxBytes < MIN_OUTPUT_BYTES) {
      throw new RangeError(`max output bytes must be an integer >= ${MIN_OUTPUT_BYTES}`);
    }
    this.maxBytes = maxBytes;
    this.count = 0;
    this.logsSize = 2;
  }

  /** Largest JSON-string size the next log entry may have without overflowing. */
  remainingForEntry() {
    return this.maxBytes - this.logsSize - (this.count ? 1 : 0) - LOG_LINE_OVERHEAD;
  }

  /** @param {string} text */
  admitLog(text) {
    this.logsSize += jsonStringSize(text) + (this.count ? 1 : 0) + LOG_LINE_OVERHEAD;
    this.count += 1;
    return this.logsSize <= this.maxBytes;
  }

  /** @param {any[]} tokens */
  fitsTokens(tokens) {
    const room = this.maxBytes - this.logsSize;
    return room >= 0 && tokensSize(tokens, room) <= room;
  }

  /** @param {string} message */
  fitsMessage(message) {
    return this.logsSize + jsonStringSize(message) <= this.maxBytes;
  }
}
