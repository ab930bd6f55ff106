// Built-ins captured when the worker's modules load, before any program code runs.
//
// A program runs in the worker's own realm and may replace globals, prototype methods or
// constructor slots. The codec, the ledger and the channel use only these captured functions
// (called through `uncurry`, which never looks anything up again), so such changes cannot
// alter what is validated, sent or charged. (The runtime re-checks everything anyway; this
// keeps the worker's own pre-checks exact.)

const { bind, call } = Function.prototype;
/** @type {<T extends (...args: any[]) => any>(fn: T) => (self: any, ...args: any[]) => any} */
const uncurry = bind.bind(call);

export const ObjectPrototype = Object.prototype;
export const ArrayPrototype = Array.prototype;
export const ObjectGetPrototypeOf = Object.getPrototypeOf;
export const ObjectSetPrototypeOf = Object.setPrototypeOf;
export const ObjectDefineProperty = Object.defineProperty;
export const ObjectFreeze = Object.freeze;
export const ObjectCreate = Object.create;
export const ObjectGetOwnPropertyDescriptor = Object.getOwnPropertyDescriptor;
export const ReflectOwnKeys = Reflect.ownKeys;
export const ReflectApply = Reflect.apply;
export const ArrayIsArray = Array.isArray;
export const NumberIsFinite = Number.isFinite;
export const NumberIsSafeInteger = Number.isSafeInteger;
export const NumberIsInteger = Number.isInteger;
export const ObjectIs = Object.is;
export const MathAbs = Math.abs;
export const MathFloor = Math.floor;
export const MathMax = Math.max;
export const MathMin = Math.min;
export const JSONStringify = JSON.stringify;
export const JSONParse = JSON.parse;
export const StringCtor = String;
export const NumberCtor = Number;
export const NumberParseInt = Number.parseInt;
export const BigIntCtor = BigInt;
export const StringFromCharCode = String.fromCharCode;
export const SafeSet = Set;
export const SafeMap = Map;
export const SetPrototypeHas = uncurry(Set.prototype.has);
export const SetPrototypeAdd = uncurry(Set.prototype.add);
export const SetPrototypeDelete = uncurry(Set.prototype.delete);
export const MapPrototypeGet = uncurry(Map.prototype.get);
export const MapPrototypeSet = uncurry(Map.prototype.set);
export const MapPrototypeDelete = uncurry(Map.prototype.delete);
export const StringPrototypeCharCodeAt = uncurry(String.prototype.charCodeAt);
export const StringPrototypeSlice = uncurry(String.prototype.slice);
export const StringPrototypeIndexOf = uncurry(String.prototype.indexOf);
export const StringPrototypeToWellFormed = uncurry(String.prototype.toWellFormed);
export const StringPrototypeSplit = uncurry(String.prototype.split);
export const StringPrototypeStartsWith = uncurry(String.prototype.startsWith);
export const StringPrototypeRepeat = uncurry(String.prototype.repeat);
export const ArrayPrototypeJoin = uncurry(Array.prototype.join);
export const ArrayPrototypeSlice = uncurry(Array.prototype.slice);
export const ArrayPrototypeSort = uncurry(Array.prototype.sort);
export const ProxyCtor = Proxy;
export const ReflectGet = Reflect.get;
export const NumberPrototypeToExponential = uncurry(Number.prototype.toExponential);
export const NumberPrototypeToString = uncurry(Number.prototype.toString);
export const BigIntPrototypeToString = uncurry(BigInt.prototype.toString);
export const SymbolPrototypeToString = uncurry(Symbol.prototype.toString);
export const RegExpPrototypeExec = uncurry(RegExp.prototype.exec);
export const FunctionPrototypeToString = uncurry(Function.prototype.toString);
export { uncurry };

/**
 * An array that inherits nothing: writing its elements can never reach a setter a program
 * defined on `Array.prototype`. For the codec's own scratch lists only (never given out).
 * @returns {any[]}
 */
export function bareArray() {
  const list = [];
  ObjectSetPrototypeOf(list, null);
  return list;
}

/**
 * A property descriptor that inherits nothing, so a `get` or `value` a program put on
 * `Object.prototype` cannot join it.
 * @param {PropertyDescriptor} fields
 * @returns {PropertyDescriptor}
 */
export function descriptor(fields) {
  return ObjectSetPrototypeOf(fields, null);
}
