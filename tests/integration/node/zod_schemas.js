// Writes the JSON Schemas zod 4 (z.toJSONSchema, the pinned zod package's
// "zod/v4" entry) produces for typical models into
// tests/data/schemas/generators/zod-NAME.json (issue 29: the schemas clients
// such as the AI SDK and LangChain send). Run: node zod_schemas.js [OUTDIR].
// Free strings carry .max(): a random-weight model seldom closes a free
// string within max_tokens (the grammar itself has no such need).
const fs = require("fs");
const path = require("path");
const { z } = require("zod/v4");

const out = process.argv[2] || path.join(__dirname, "..", "..", "data", "schemas", "generators");
const Address = z.object({ street: z.string().max(40), city: z.string().max(30), zip: z.string().regex(/^\d{5}$/) });
const Color = z.enum(["red", "green", "blue"]);
const Category = z.lazy(() => z.object({ name: z.string().max(20), children: z.array(Category).max(2) }));
const Tree = z.object({ value: z.number().int().min(0).max(99), get left() { return Tree.optional(); }, get right() { return Tree.optional(); } });
const models = {
  person: z.object({ name: z.string().max(30), age: z.number().int() }),
  "person-optional": z.object({ name: z.string().max(30), nickname: z.string().max(10).optional(), age: z.number().int().positive().optional() }),
  "nested-address": z.object({ name: z.string().max(20), address: Address }),
  "array-of-objects": z.object({ items: z.array(z.object({ sku: z.string().max(12), qty: z.number().int().min(1).max(99) })).max(4) }),
  enum: z.object({ color: Color }),
  "enum-array": z.object({ colors: z.array(Color).max(3) }),
  literal: z.object({ kind: z.literal("user"), id: z.number().int() }),
  "literal-union": z.object({ status: z.union([z.literal("ok"), z.literal("error"), z.literal(404)]) }),
  union: z.object({ value: z.union([z.string().max(10), z.number(), z.boolean()]) }),
  "discriminated-union": z.object({ shape: z.discriminatedUnion("type", [
    z.object({ type: z.literal("circle"), radius: z.number().positive() }),
    z.object({ type: z.literal("rect"), w: z.number().nonnegative(), h: z.number().nonnegative() })]) }),
  nullable: z.object({ note: z.string().max(20).nullable(), count: z.number().int().nullable() }),
  "nullish": z.object({ tag: z.string().max(8).nullish() }),
  "int-positive": z.object({ n: z.number().int().positive() }),
  "int-nonnegative": z.object({ n: z.number().int().nonnegative() }),
  "int-negative": z.object({ n: z.number().int().negative() }),
  "int-range": z.object({ age: z.number().int().min(0).max(150) }),
  "int-multiple": z.object({ step: z.number().int().multipleOf(5) }),
  "int-multiple-odd": z.object({ step: z.number().int().multipleOf(3).min(0).max(300) }),
  "int-gt-lt": z.object({ n: z.number().int().gt(-10).lt(10) }),
  "number-range": z.object({ ratio: z.number().min(0).max(1), share: z.number().min(0.05).max(0.5), temp: z.number().min(-1.5).max(2.5) }),
  "number-positive": z.object({ price: z.number().positive() }),
  "number-gt-lt": z.object({ temp: z.number().gt(-40).lt(60) }),
  "string-length": z.object({ code: z.string().min(2).max(6) }),
  "string-regex": z.object({ sku: z.string().regex(/^[A-Z]{3}-\d{4}$/) }),
  email: z.object({ email: z.email() }),
  uuid: z.object({ id: z.uuid() }),
  uuidv4: z.object({ id: z.uuidv4() }),
  date: z.object({ day: z.iso.date() }),
  datetime: z.object({ at: z.iso.datetime() }),
  "datetime-offset": z.object({ at: z.iso.datetime({ offset: true }) }),
  time: z.object({ at: z.iso.time() }),
  url: z.object({ homepage: z.url() }),
  network: z.object({ v4: z.ipv4(), v6: z.ipv6(), cidr: z.cidrv4() }),
  ids: z.object({ cuid2: z.cuid2().max(12), nanoid: z.nanoid(), ulid: z.ulid() }),
  duration: z.object({ every: z.iso.duration() }),
  record: z.object({ scores: z.record(z.string().max(8), z.number().int().min(0).max(100)) }),
  "record-enum-keys": z.object({ stock: z.record(z.enum(["xs", "s", "m", "l"]), z.number().int().nonnegative()) }),
  "record-regex-keys": z.object({ env: z.record(z.string().regex(/^[A-Z_]{1,10}$/), z.string().max(20)) }),
  tuple: z.object({ point: z.tuple([z.number(), z.number()]) }),
  "tuple-mixed": z.object({ entry: z.tuple([z.string().max(10), z.number().int(), z.boolean()]) }),
  "array-min-max": z.object({ tags: z.array(z.string().max(10)).min(1).max(3) }),
  "recursive-category": Category,
  "recursive-tree": Tree,
  "boolean-flags": z.object({ active: z.boolean(), admin: z.boolean().optional() }),
  "default-value": z.object({ retries: z.number().int().min(0).max(10).default(3), verbose: z.boolean().default(false) }),
  "described": z.object({ city: z.string().max(30).describe("The city"), unit: z.enum(["c", "f"]).describe("Unit") }).describe("Weather query"),

  "calendar-event": z.object({ title: z.string().max(40), start: z.iso.datetime(), end: z.iso.datetime(),
    attendees: z.array(z.object({ name: z.string().max(20), email: z.email() })).max(3), allDay: z.boolean() }),
  "order": z.object({ orderId: z.uuid(), createdAt: z.iso.date(), status: z.enum(["pending", "paid", "shipped"]),
    lines: z.array(z.object({ sku: z.string().regex(/^[A-Z0-9]{4,8}$/), qty: z.number().int().positive().max(1000), price: z.number().nonnegative() })).min(1).max(3),
    note: z.string().max(50).optional() }),
  "sentiment": z.object({ label: z.enum(["positive", "negative", "neutral"]), score: z.number().min(0).max(1) }),
  "extraction": z.object({ people: z.array(z.object({ name: z.string().max(20), role: z.string().max(20).nullable() })).max(3) }),
  "top-level-array": z.array(z.number().int().min(1).max(9)).max(5),
  "top-level-enum": Color,
};
fs.mkdirSync(out, { recursive: true });
let n = 0;
for (const [name, schema] of Object.entries(models)) {
  fs.writeFileSync(path.join(out, `zod-${name}.json`), JSON.stringify(z.toJSONSchema(schema), null, 2) + "\n");
  n++;
}
console.log(`${n} zod schemas in ${out}`);
