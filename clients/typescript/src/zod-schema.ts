/**
 * Zod 4 schemas as tool schemas. A schema is recognized by its shape (zod 4 keeps its internals
 * in `_zod`, with the definition in `_zod.def`), and zod is loaded only when one is converted:
 * zod is an optional peer dependency, and a provider that declares JSON Schema never loads it.
 * The conversion is zod's own `toJSONSchema`; the registry then validates and types the tool
 * from that JSON Schema exactly as from one written by hand.
 */
import type { JsonValue } from "./json";

/** A zod 4 schema (any zod type: `z.object(...)`, `z.string()`, ...). */
export interface ZodSchemaLike {
  readonly _zod: { readonly def: unknown };
}

/** The type a zod schema accepts (its input side): what a handler's arguments are. */
export type ZodInput<S> = S extends { readonly _zod: { readonly input: infer I } } ? I : never;

export function isZodSchema(value: unknown): value is ZodSchemaLike {
  if (typeof value !== "object" || value === null) return false;
  const internals = (value as { _zod?: unknown })._zod;
  return typeof internals === "object" && internals !== null && "def" in internals;
}

interface Zod {
  toJSONSchema(schema: ZodSchemaLike, params: { io: "input" | "output" }): unknown;
  safeParseAsync(
    schema: ZodSchemaLike,
    value: unknown,
  ): Promise<{ success: true; data: unknown } | { success: false; error: { issues: readonly ZodIssue[] } }>;
}

/** One problem zod found in a value: where (keys and indexes from the root) and what. */
export interface ZodIssue {
  readonly path: readonly PropertyKey[];
  readonly message: string;
}

let zod: Zod | undefined;

function loadZod(where: string): Zod {
  if (zod !== undefined) return zod;
  let loaded: Partial<Zod>;
  try {
    // Resolved from this package, i.e. the application's zod (a peer dependency).
    loaded = require("zod") as Partial<Zod>;
  } catch (e) {
    throw new TypeError(`${where} is a zod schema, but zod cannot be loaded (install zod 4): ${String(e)}`);
  }
  if (typeof loaded.toJSONSchema !== "function" || typeof loaded.safeParseAsync !== "function") {
    throw new TypeError(`${where} is a zod schema, but the installed zod has no toJSONSchema (zod 4 is needed)`);
  }
  zod = loaded as Zod;
  return zod;
}

/**
 * `schema` as JSON Schema: a zod schema converted for the side it describes (`input`: what a
 * caller may send, so fields with defaults are optional; `output`: what the handler returns),
 * anything else as it is. Throws a TypeError naming `where` for a zod schema that JSON Schema
 * cannot express (e.g. `z.date()`, transforms) and for a zod 3 schema.
 */
export function toJsonSchema(schema: JsonValue | ZodSchemaLike, io: "input" | "output", where: string): JsonValue {
  if (!isZodSchema(schema)) {
    const legacy = schema as { _def?: unknown; safeParse?: unknown } | null;
    if (typeof legacy === "object" && legacy !== null && "_def" in legacy && typeof legacy.safeParse === "function") {
      throw new TypeError(`${where} is a zod 3 schema: use zod 4 (or JSON Schema)`);
    }
    return schema;
  }
  const convert = loadZod(where);
  try {
    return convert.toJSONSchema(schema, { io }) as JsonValue;
  } catch (e) {
    throw new TypeError(`${where}: the zod schema cannot be expressed as JSON Schema: ${(e as Error).message ?? String(e)}`);
  }
}

/**
 * `value` parsed by a zod `schema` (its defaults filled in, its refinements and transforms run):
 * the parsed value, or the issues zod found. `where` names the schema if zod cannot be loaded.
 */
export async function parseWithZod(
  schema: ZodSchemaLike,
  value: unknown,
  where: string,
): Promise<{ ok: true; value: unknown } | { ok: false; issues: readonly ZodIssue[] }> {
  const parsed = await loadZod(where).safeParseAsync(schema, value);
  return parsed.success ? { ok: true, value: parsed.data } : { ok: false, issues: parsed.error.issues };
}
