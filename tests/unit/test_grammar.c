/* tests/unit/test_grammar.c - the grammar library (engine/grammar/) on the
 * real Qwen3 vocabulary.
 *
 * The main check is a random walk: from a compiled grammar, repeatedly take
 * the mask, pick one allowed token uniformly (a fixed seed per walk, printed
 * on failure), accept it, until the walk picks EOS. Every step also checks
 * that EOS is in the mask exactly when gram_match_complete() says so. The
 * document must then parse with cJSON and satisfy the schema (a small
 * validator below covers the keywords the library supports). Refusals are
 * checked by code (BAD_PARAM) and by the JSON pointer or line:column the
 * message must name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "event.h"
#include "grammar/grammar.h"
#include "tokenizer.h"

#define N_VOCAB 151936 /* the Qwen3 models' embedding rows (> tokenizer ids) */

static struct tokenizer *tok;
static struct gram_vocab *voc;
static int32_t eos_id;

static const char *tb(void *u, int32_t id, size_t *len, int *sp)
{
    const struct tokenizer *t = u;
    if (id >= tok_n_ids(t)) return NULL;
    *sp = tok_is_special(t, id);
    return tok_token_bytes(t, id, len);
}

static int setup(void **state)
{
    struct rl_err err = {0};
    if (tok_load(&tok, tu_qwen3_tokenizer_dir(), &err)) {
        fprintf(stderr, "tok_load: %s\n", err.msg);
        return -1;
    }
    int32_t eos[2] = {tok_find(tok, "<|im_end|>", 10), tok_find(tok, "<|endoftext|>", 13)};
    eos_id = eos[0];
    if (gram_vocab_create(&voc, N_VOCAB, tb, tok, eos, 2, &err)) {
        fprintf(stderr, "gram_vocab_create: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    gram_vocab_free(voc);
    tok_free(tok);
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static bool bit(const uint32_t *m, int32_t id) { return m[id >> 5] >> (id & 31) & 1; }

/* A uniform random walk to EOS; returns the document (malloc'd) or NULL
 * when max_steps pass first. Checks the EOS / complete agreement. */
static char *walk(struct gram *g, uint64_t seed, int max_steps, int *n_steps)
{
    struct gram_match *m;
    struct rl_err err = {0};
    assert_int_equal(gram_match_create(&m, g, &err), 0);
    uint32_t *mask = malloc(sizeof(uint32_t) * gram_mask_words_n(N_VOCAB));
    int32_t *allowed = malloc(sizeof(int32_t) * N_VOCAB);
    size_t cap = 4096, n = 0;
    char *doc = malloc(cap);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    int step = 0;
    bool ended = false;
    for (; step < max_steps; step++) {
        assert_int_equal(gram_match_mask(m, mask), 0);
        int na = 0;
        for (int32_t id = 0; id < N_VOCAB; id++)
            if (bit(mask, id)) allowed[na++] = id;
        if (bit(mask, eos_id) != gram_match_complete(m))
            fail_msg("seed %llu step %d: eos in mask %d, complete %d", (unsigned long long)seed, step,
                     bit(mask, eos_id), gram_match_complete(m));
        if (na == 0) fail_msg("seed %llu step %d: empty mask after '%.*s'", (unsigned long long)seed, step, (int)n, doc);
        for (int k = 0; k < na; k++)
            if (tok_is_special(tok, allowed[k]) && !gram_match_complete(m))
                fail_msg("seed %llu step %d: special token %d allowed inside the document",
                         (unsigned long long)seed, step, allowed[k]);
        if (gram_match_done(m) && (na != 2 || !bit(mask, eos_id)))
            fail_msg("seed %llu: done but %d tokens allowed", (unsigned long long)seed, na);
        int32_t id = allowed[rng_next(&s) % (uint64_t)na];
        if (id == eos_id || (gram_match_complete(m) && tok_is_special(tok, id))) {
            assert_int_equal(gram_match_accept(m, id, &err), 0);
            ended = true;
            break;
        }
        if (gram_match_accept(m, id, &err))
            fail_msg("seed %llu step %d: accept %d: %s", (unsigned long long)seed, step, id, err.msg);
        size_t len;
        const char *b = tok_token_bytes(tok, id, &len);
        while (n + len + 1 > cap) doc = realloc(doc, cap *= 2);
        memcpy(doc + n, b, len);
        n += len;
    }
    doc[n] = 0;
    *n_steps = step;
    free(mask);
    free(allowed);
    gram_match_free(m);
    if (!ended) { free(doc); return NULL; }
    return doc;
}

static struct gram *schema(const char *json)
{
    struct gram *g = NULL;
    struct rl_err err = {0};
    int rc = gram_compile_json_schema(&g, voc, json, strlen(json), &err);
    if (rc) fail_msg("compile %s: %s", json, err.msg);
    return g;
}

/* ---- a validator for the supported subset ---- */
static bool validate(const cJSON *v, const cJSON *s, const cJSON *root, char *why, size_t wn);

static bool type_ok(const cJSON *v, const char *t)
{
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    return false;
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

#define WHY(...) do { snprintf(why, wn, __VA_ARGS__); return false; } while (0)

static bool validate(const cJSON *v, const cJSON *s, const cJSON *root, char *why, size_t wn)
{
    if (cJSON_IsTrue(s)) return true;
    if (cJSON_IsFalse(s)) WHY("false schema");
    const cJSON *x;
    if ((x = cJSON_GetObjectItem(s, "$ref"))) {
        const char *r = x->valuestring;
        const cJSON *t = root;
        if (!strncmp(r, "#/$defs/", 8)) t = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "$defs"), r + 8);
        return validate(v, t, root, why, wn);
    }
    if ((x = cJSON_GetObjectItem(s, "type"))) {
        bool ok = false;
        if (cJSON_IsString(x)) ok = type_ok(v, x->valuestring);
        else for (const cJSON *t = x->child; t; t = t->next) ok |= type_ok(v, t->valuestring);
        if (!ok) WHY("type");
    }
    if ((x = cJSON_GetObjectItem(s, "enum"))) {
        bool ok = false;
        for (const cJSON *e = x->child; e; e = e->next) ok |= cJSON_Compare(v, e, 1);
        if (!ok) WHY("enum");
    }
    if ((x = cJSON_GetObjectItem(s, "const")) && !cJSON_Compare(v, x, 1)) WHY("const");
    if ((x = cJSON_GetObjectItem(s, "anyOf")) || (x = cJSON_GetObjectItem(s, "oneOf"))) {
        bool ok = false;
        for (const cJSON *e = x->child; e; e = e->next) ok |= validate(v, e, root, why, wn);
        if (!ok) WHY("anyOf");
    }
    if ((x = cJSON_GetObjectItem(s, "allOf")))
        for (const cJSON *e = x->child; e; e = e->next) if (!validate(v, e, root, why, wn)) return false;
    if (cJSON_IsString(v)) {
        size_t n = utf8_chars(v->valuestring);
        if ((x = cJSON_GetObjectItem(s, "minLength")) && n < (size_t)x->valuedouble) WHY("minLength");
        if ((x = cJSON_GetObjectItem(s, "maxLength")) && n > (size_t)x->valuedouble) WHY("maxLength");
    }
    if (cJSON_IsNumber(v)) {
        if ((x = cJSON_GetObjectItem(s, "minimum")) && v->valuedouble < x->valuedouble) WHY("minimum");
        if ((x = cJSON_GetObjectItem(s, "maximum")) && v->valuedouble > x->valuedouble) WHY("maximum");
        const cJSON *y;
        if ((x = cJSON_GetObjectItem(s, "exclusiveMinimum"))) {
            if (cJSON_IsNumber(x) && v->valuedouble <= x->valuedouble) WHY("exclusiveMinimum");
            if (cJSON_IsTrue(x) && (y = cJSON_GetObjectItem(s, "minimum")) && v->valuedouble <= y->valuedouble) WHY("exclusiveMinimum");
        }
        if ((x = cJSON_GetObjectItem(s, "exclusiveMaximum"))) {
            if (cJSON_IsNumber(x) && v->valuedouble >= x->valuedouble) WHY("exclusiveMaximum");
            if (cJSON_IsTrue(x) && (y = cJSON_GetObjectItem(s, "maximum")) && v->valuedouble >= y->valuedouble) WHY("exclusiveMaximum");
        }
        if ((x = cJSON_GetObjectItem(s, "multipleOf")) && fmod(v->valuedouble, x->valuedouble) != 0) WHY("multipleOf");
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((x = cJSON_GetObjectItem(s, "minItems")) && n < x->valuedouble) WHY("minItems");
        if ((x = cJSON_GetObjectItem(s, "maxItems")) && n > x->valuedouble) WHY("maxItems");
        if (cJSON_IsTrue(cJSON_GetObjectItem(s, "uniqueItems")))
            for (int i = 0; i < n; i++)
                for (int j = 0; j < i; j++)
                    if (cJSON_Compare(cJSON_GetArrayItem(v, i), cJSON_GetArrayItem(v, j), 1)) WHY("uniqueItems");
        const cJSON *pre = cJSON_GetObjectItem(s, "prefixItems"), *it = cJSON_GetObjectItem(s, "items");
        if (cJSON_IsArray(it)) { pre = it; it = cJSON_GetObjectItem(s, "additionalItems"); }
        int k = pre ? cJSON_GetArraySize(pre) : 0;
        for (int i = 0; i < n; i++) {
            const cJSON *sub = i < k ? cJSON_GetArrayItem(pre, i) : it;
            if (sub && !validate(cJSON_GetArrayItem(v, i), sub, root, why, wn)) return false;
        }
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItem(s, "properties"), *add = cJSON_GetObjectItem(s, "additionalProperties");
        for (const cJSON *r = cJSON_GetObjectItem(s, "required") ? cJSON_GetObjectItem(s, "required")->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItem(v, r->valuestring)) WHY("required %s", r->valuestring);
        int np = 0;
        for (const cJSON *m = v->child; m; m = m->next) {
            for (const cJSON *m2 = v->child; m2 != m; m2 = m2->next)
                if (!strcmp(m->string, m2->string)) WHY("duplicate key %s", m->string);
            np++;
        }
        if ((x = cJSON_GetObjectItem(s, "minProperties")) && np < x->valuedouble) WHY("minProperties");
        if ((x = cJSON_GetObjectItem(s, "maxProperties")) && np > x->valuedouble) WHY("maxProperties");
        const cJSON *pn = cJSON_GetObjectItem(s, "propertyNames"), *pp = cJSON_GetObjectItem(s, "patternProperties");
        if (pp && pp->child) add = pp->child; /* the one pattern the tests use; keys checked by the grammar */
        for (const cJSON *m = v->child; m; m = m->next) {
            cJSON *key = cJSON_CreateString(m->string);
            bool kok = !pn || validate(key, pn, root, why, wn);
            cJSON_Delete(key);
            if (!kok) return false;
        }
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps) { if (!validate(m, ps, root, why, wn)) return false; }
            else if (add && !validate(m, add, root, why, wn)) return false;
        }
    }
    return true;
}

/* Walks schema json with several seeds; each document must parse and
 * validate. */
static void walks(const char *json, int seeds, int max_steps)
{
    struct gram *g = schema(json);
    cJSON *s = cJSON_Parse(json);
    assert_non_null(s);
    for (int seed = 1; seed <= seeds; seed++) {
        int steps;
        char *doc = walk(g, (uint64_t)seed, max_steps, &steps);
        if (!doc) fail_msg("schema %s seed %d: no EOS within %d steps", json, seed, max_steps);
        if (getenv("TEST_GRAMMAR_VERBOSE")) fprintf(stderr, "%d steps: %s\n", steps, doc);
        cJSON *v = cJSON_Parse(doc);
        if (!v) { FILE *f = fopen("/tmp/schema29-bad.json", "w"); if (f) { fputs(doc, f); fclose(f); } fail_msg("schema %s seed %d: not JSON: %s", json, seed, doc); }
        char why[200] = "";
        if (!validate(v, s, s, why, sizeof why)) fail_msg("schema %s seed %d: %s fails %s", json, seed, doc, why);
        cJSON_Delete(v);
        free(doc);
    }
    cJSON_Delete(s);
    gram_unref(g);
}

static void test_schema_walks(void **state)
{
    static const char *const corpus[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
        "{\"type\":\"boolean\"}",
        "{\"type\":\"null\"}",
        "{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}",
        "{\"type\":\"number\"}",
        "{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1,2]}]}",
        "{\"const\":\"fixed \\\"quoted\\\" \\u00e9\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9},\"minItems\":2,\"maxItems\":4}",
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"boolean\"}],\"items\":{\"type\":\"null\"},\"maxItems\":3}",
        "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
        "{\"type\":\"string\",\"format\":\"date\"}",
        "{\"type\":\"string\",\"format\":\"date-time\"}",
        "{\"type\":\"string\",\"format\":\"uuid\"}",
        "{\"type\":\"string\",\"format\":\"email\"}",
        "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}(x|yz)?$\"}",
        "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":5},{\"type\":\"string\",\"maxLength\":4}]}",
        "{\"type\":[\"string\",\"null\"],\"maxLength\":3}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"maximum\":9,\"minimum\":0},\"b\":{\"type\":\"boolean\"},\"c\":{\"type\":\"null\"}},\"required\":[\"b\"],\"additionalProperties\":false}",
        "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"boolean\"}},\"required\":[\"x\"]},{\"properties\":{\"y\":{\"enum\":[1,2]}},\"required\":[\"y\"]}]}",
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
        "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}},\"required\":[\"id\"],\"additionalProperties\":{\"type\":\"boolean\"}}",
        /* keys and values that need JSON escapes */
        "{\"type\":\"object\",\"properties\":{\"a\\\"b\\\\ \u00e9\\n\":{\"enum\":[\"x\\ty\",\"\\u0001\"]}},\"required\":[\"a\\\"b\\\\ \u00e9\\n\"],\"additionalProperties\":false}",
        "{\"type\":\"string\",\"pattern\":\"^[\\\"\\\\\\\\n]{2}[^a-z]?$\"}",
        "{\"type\":\"string\",\"pattern\":\"^x[a-z]*\"}",
        /* issue 29: what zod and Pydantic write */
        "{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}",
        "{\"type\":\"integer\",\"minimum\":-9223372036854775808,\"maximum\":9223372036854775807}",
        "{\"type\":\"integer\",\"exclusiveMinimum\":0}",
        "{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":10,\"exclusiveMaximum\":true}",
        "{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}",
        "{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":3}",
        "{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.9}",
        "{\"type\":\"number\",\"minimum\":0,\"maximum\":0.5}",
        "{\"type\":\"number\",\"exclusiveMinimum\":-0.25,\"exclusiveMaximum\":0.25}",
        "{\"type\":\"number\",\"minimum\":1.5,\"maximum\":2.5}",
        "{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":-9007199254740991,\"maximum\":9007199254740991}",
        "{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":0,\"maximum\":100}",
        "{\"type\":\"integer\",\"multipleOf\":3}",
        "{\"type\":\"number\",\"multipleOf\":25,\"minimum\":-1000}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"uniqueItems\":true}",
        "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true,\"minItems\":1}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}",
        "{\"type\":\"object\",\"propertyNames\":{\"type\":\"string\"},\"additionalProperties\":{\"type\":\"number\"},\"maxProperties\":3}",
        "{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^[a-z]{1,8}$\"},\"additionalProperties\":{\"type\":\"number\"}}",
        "{\"type\":\"object\",\"propertyNames\":{\"enum\":[\"x\",\"y\"]},\"additionalProperties\":{\"type\":\"boolean\"},\"maxProperties\":1}",
        "{\"type\":\"object\",\"patternProperties\":{\"^[a-z]{1,4}$\":{\"type\":\"integer\",\"minimum\":0}},\"additionalProperties\":false,\"minProperties\":1}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"minProperties\":1,\"maxProperties\":1,\"additionalProperties\":false}",
        "{\"type\":\"string\",\"format\":\"time\"}",
        "{\"type\":\"string\",\"format\":\"uri\"}",
        "{\"title\":\"C\",\"description\":\"wrapped\",\"allOf\":[{\"enum\":[\"r\",\"g\"]}]}",
        "{\"type\":\"string\",\"format\":\"ipv4\"}",
        "{\"type\":\"string\",\"format\":\"ipv6\"}",
        "{\"type\":\"string\",\"format\":\"hostname\"}",
        "{\"type\":\"string\",\"format\":\"duration\"}",
        /* Pydantic's HttpUrl; zod's cuid2 (no JSON Schema format: the pattern decides) */
        "{\"type\":\"string\",\"format\":\"uri\",\"minLength\":1,\"maxLength\":2083}",
        "{\"type\":\"string\",\"format\":\"cuid2\",\"pattern\":\"^[0-9a-z]+$\",\"maxLength\":8}",
        /* pattern with minLength/maxLength (Pydantic constr, zod .regex().max()) */
        "{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":12}",
        "{\"type\":\"string\",\"pattern\":\"^[a-z]+(-[a-z]+)*$\",\"minLength\":3,\"maxLength\":10}",
        "{\"type\":\"string\",\"pattern\":\"ab\",\"maxLength\":6}",
        /* draft 4 tuples (Pydantic 1) */
        "{\"type\":\"array\",\"minItems\":2,\"maxItems\":2,\"items\":[{\"type\":\"number\"},{\"type\":\"boolean\"}]}",
        "true",
        "{}",
    };
    for (size_t i = 0; i < sizeof corpus / sizeof *corpus; i++)
        walks(corpus[i], 3, 20000);
}

static void test_ebnf_walk(void **state)
{
    const char *src =
        "# a tiny command language\n"
        "root ::= cmd (\"; \" cmd){0,3}\n"
        "cmd ::= (\"go \" dir | \"say \" word) \n"
        "dir ::= \"north\" | \"south\" | [ew] \"ast\"\n"
        "word ::= [a-z\\u00e9]{1,8}\n";
    struct gram *g;
    struct rl_err err = {0};
    assert_int_equal(gram_compile_ebnf(&g, voc, src, strlen(src), &err), 0);
    for (int seed = 1; seed <= 5; seed++) {
        int steps;
        char *doc = walk(g, (uint64_t)seed, 500, &steps);
        assert_non_null(doc);
        if (getenv("TEST_GRAMMAR_VERBOSE")) fprintf(stderr, "%d steps: %s\n", steps, doc);
        /* structure: commands separated by "; " */
        char *save = NULL;
        for (char *c = strtok_r(doc, ";", &save); c; c = strtok_r(NULL, ";", &save)) {
            if (*c == ' ') c++;
            bool ok = !strcmp(c, "go north") || !strcmp(c, "go south") || !strcmp(c, "go east") ||
                      !strcmp(c, "go wast") || !strncmp(c, "say ", 4);
            if (!ok) fail_msg("seed %d: bad command '%s'", seed, c);
        }
        free(doc);
    }
    gram_unref(g);
}

static void expect_refusal(int rc, const struct rl_err *err, const char *src, const char *want)
{
    if (rc == 0) fail_msg("%.200s: compiled, expected a refusal naming '%s'", src, want);
    if (err->code != EV_CODE_BAD_PARAM) fail_msg("%.200s: code %d (%s), want BAD_PARAM", src, err->code, err->msg);
    if (!strstr(err->msg, want)) fail_msg("%.200s: message '%s' lacks '%s'", src, err->msg, want);
}

static void test_schema_refusals(void **state)
{
    static const char *const cases[][2] = {
        /* unsupported keywords, each named by its JSON pointer */
        {"{\"type\":\"array\",\"items\":{\"not\":{\"type\":\"string\"}}}", "/items/not: unsupported keyword"},
        {"{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"dependentRequired\":{}}}}",
         "/properties/age/dependentRequired: unsupported keyword"},
        {"{\"$defs\":{\"a\":{\"contains\":true}},\"$ref\":\"#/$defs/a\"}", "/$defs/a/contains: unsupported keyword"},
        {"{\"properties\":{\"a/b\":{\"multipleOf\":0.01}}}", "/properties/a~1b/multipleOf: 0.01: only whole divisors"},
        /* issue 29: what the grammar cannot enforce exactly is refused */
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true,\"minItems\":2}", "/uniqueItems: over items that are not a finite set"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"uniqueItems\":true}", "/uniqueItems: together with prefixItems"},
        {"{\"type\":\"object\",\"minProperties\":2,\"additionalProperties\":{\"type\":\"integer\"}}", "/minProperties: not enforced"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"maxProperties\":0}", "/maxProperties: not enforced"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"propertyNames\":{\"maxLength\":3},\"additionalProperties\":true}", "/propertyNames: together with properties"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^a\":{},\"^b\":{}}}", "/patternProperties: more than one pattern"},
        {"{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^\\\\d+$\"}", "/pattern: format 'date' together with this pattern is not supported"},
        {"{\"type\":\"string\",\"pattern\":\"^abcdef$\",\"maxLength\":3}", "/pattern: together with minLength/maxLength: no bounding"},
        {"{\"type\":\"string\",\"pattern\":\"^(a|b+)$\",\"minLength\":2}", "/pattern: together with minLength/maxLength: no bounding"},
        {"{\"if\":{},\"then\":{}}", "/if: unsupported keyword: the grammar cannot enforce it exactly"},
        {"{\"type\":\"integer\",\"minimum\":1e19}", "/minimum: the integers allowed are all beyond the supported magnitude"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":3,\"maximum\":3}", "no integer satisfies"},
        {"{\"type\":\"number\",\"minimum\":0.1001,\"maximum\":0.1009}", "a range narrower than 0.001 without an integer"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":true}", "/exclusiveMinimum: true (draft 4) needs minimum beside it"},
        {"{\"type\":\"integer\",\"minimum\":7,\"maximum\":9,\"multipleOf\":5}", "no integer satisfies"},
        {"{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"uniqueItems\":true,\"minItems\":3}", "no array satisfies"},
        {"{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"a\":{\"type\":\"string\"}}}]}", "'a' has different schemas in two members"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"if\":{}}]}", "/anyOf/1/if: unsupported keyword"},
        {"{\"type\":\"string\",\"format\":\"uri-template\"}", "/format: 'uri-template' is not supported"},
        {"{\"type\":\"string\",\"format\":\"email\",\"maxLength\":50}", "/format: 'email' (written 5-384 characters long) together with minLength 0 / maxLength 50"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "/pattern: lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "/pattern: unsupported escape"},
        {"{\"type\":\"strin\"}", "/type: 'strin' is not a JSON Schema type"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "/$ref: 'http://example.com/s.json' does not resolve"},
        {"{\"type\":\"string\",\"minLength\":-1}", "/minLength: must be a non-negative integer"},
        /* unsatisfiable */
        {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "no string satisfies"},
        {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":1}", "no integer satisfies"},
        {"{\"enum\":[]}", "no string satisfies"},
        {"{\"enum\":[1,2],\"type\":\"string\"}", "no string satisfies"},
        {"false", "no string satisfies"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}", "no string satisfies"},
        {"{\"type\":\"object\",\"required\":[\"a\"],\"additionalProperties\":false}", "no object satisfies"},
        {"{\"type\":\"array\",\"items\":false,\"minItems\":1}", "no array satisfies"},
        /* issue 29: a property required by one allOf member and shut out by
         * another's additionalProperties false */
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false},{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
         "/allOf: 'b' is required by /allOf/1 but not allowed by /allOf/0 (additionalProperties false): no object satisfies this schema"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "no string satisfies"},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"k\"]}},\"$ref\":\"#/$defs/n\"}",
         "no string satisfies"},
        /* too large once expanded */
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"maxLength\":1999},{\"type\":\"string\",\"maxLength\":1998},{\"type\":\"string\",\"maxLength\":1997}]}", "schema is too large (over 50000 automaton states)"},
        {"{\"type\":\"string\",\"minLength\":2001}", "/minLength: 2001 is over the supported limit of 2000"},
        /* not JSON */
        {"{\"type\":", "not valid JSON"},
        /* not UTF-8 (found by tests/fuzz/fuzz_grammar: the bytes reached the
         * generated grammar, whose parser refused it as our bug) */
        {"{\"enum\":[\"h\xc3\xa9llo\",\"\xe3\x81\xff\"]}", "schema is not valid UTF-8 (at byte 19)"},
        {"{\"const\":\"\xed\xa0\x80\"}", "schema is not valid UTF-8 (at byte 10)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct gram *g = NULL;
        struct rl_err err = {0};
        int rc = gram_compile_json_schema(&g, voc, cases[i][0], strlen(cases[i][0]), &err);
        expect_refusal(rc, &err, cases[i][0], cases[i][1]);
        assert_null(g);
    }
}

static void test_limits(void **state)
{
    /* 1 MB: a valid schema padded with a long description */
    size_t n = 1 << 20;
    char *big = malloc(n + 1);
    int k = snprintf(big, n, "{\"type\":\"string\",\"description\":\"");
    memset(big + k, 'x', n - (size_t)k - 2);
    memcpy(big + n - 2, "\"}", 3);
    struct gram *g = NULL;
    struct rl_err err = {0};
    expect_refusal(gram_compile_json_schema(&g, voc, big, n, &err), &err, "1 MB schema", "bytes; the limit is");
    expect_refusal(gram_compile_ebnf(&g, voc, big, n, &err), &err, "1 MB grammar", "bytes; the limit is");
    free(big);
    /* depth 1000: items inside items */
    struct { char *p; size_t n; } b = {malloc(20 * 1000 + 100), 0};
    for (int i = 0; i < 1000; i++) b.n += (size_t)sprintf(b.p + b.n, "{\"items\":");
    b.n += (size_t)sprintf(b.p + b.n, "true");
    for (int i = 0; i < 1000; i++) b.p[b.n++] = '}';
    b.p[b.n] = 0;
    expect_refusal(gram_compile_json_schema(&g, voc, b.p, b.n, &err), &err, "depth 1000", "nests 1000 levels deep; the limit is 64");
    /* and a tools array as deep */
    expect_refusal(gram_compile_tool_call(&g, voc, b.p, b.n, NULL, &err), &err, "deep tools", "nests");
    static const char bad_tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\xff\"}}]";
    expect_refusal(gram_compile_tool_call(&g, voc, bad_tools, strlen(bad_tools), NULL, &err), &err,
                   "tools not UTF-8", "tools is not valid UTF-8 (at byte 41)");
    free(b.p);
    /* depth 64 is fine */
    struct { char p[2000]; size_t n; } c = {.n = 0};
    for (int i = 0; i < 30; i++) c.n += (size_t)sprintf(c.p + c.n, "{\"items\":");
    c.n += (size_t)sprintf(c.p + c.n, "{\"type\":\"integer\",\"minimum\":0,\"maximum\":3}");
    for (int i = 0; i < 30; i++) c.p[c.n++] = '}';
    c.p[c.n] = 0;
    walks(c.p, 2, 4000);
}

static void test_ebnf_refusals(void **state)
{
    static const char *const cases[][2] = {
        {"root ::= \"abc", "1:14: unterminated string"},
        {"root ::= foo", "1:10: rule 'foo' is used but not defined"},
        {"root ::= a\na ::= a \"x\" | \"y\"", "rule 'a' is left-recursive"},
        {"root ::= [z-a]", "1:14: character range is reversed"},
        {"rot ::= \"x\"", "no rule named 'root'"},
        {"root ::= \"a\"{3,1}", "1:13: repetition {m,n} has n < m"},
        {"root ::= (\"a\"", "1:14: expected ')'"},
        {"root ::= \"a\" )", "1:14: unexpected ')'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "2:1: rule 'root' is defined twice"},
        {"root ::= \"\\q\"", "1:13: unknown escape \\q"},
        {"root ::= []", "no string satisfies this grammar"},
        {"root ::= x\nx ::= \"(\" x \")\"", "no string satisfies this grammar"},
        {"= \"a\"", "1:1: expected a rule"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct gram *g = NULL;
        struct rl_err err = {0};
        int rc = gram_compile_ebnf(&g, voc, cases[i][0], strlen(cases[i][0]), &err);
        expect_refusal(rc, &err, cases[i][0], cases[i][1]);
    }
}

/* Rollback restores the state exactly: the mask after rolling back equals
 * the mask recorded before, at every depth. */
static void test_rollback(void **state)
{
    struct gram *g = schema("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6}},"
                            "\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":500}},\"required\":[\"tags\",\"n\"]}");
    struct gram_match *m;
    struct rl_err err = {0};
    assert_int_equal(gram_match_create(&m, g, &err), 0);
    int W = gram_mask_words_n(N_VOCAB);
    enum { STEPS = 12 };
    uint32_t *masks = malloc(sizeof(uint32_t) * (size_t)W * (STEPS + 1));
    uint32_t *now = malloc(sizeof(uint32_t) * (size_t)W);
    int32_t *allowed = malloc(sizeof(int32_t) * N_VOCAB);
    uint64_t s = 7;
    int taken = 0;
    for (; taken < STEPS; taken++) {
        gram_match_mask(m, masks + (size_t)W * taken);
        int na = 0;
        for (int32_t id = 0; id < N_VOCAB; id++)
            if (bit(masks + (size_t)W * taken, id) && id != eos_id && !tok_is_special(tok, id)) allowed[na++] = id;
        if (!na) break;
        assert_int_equal(gram_match_accept(m, allowed[rng_next(&s) % (uint64_t)na], &err), 0);
    }
    assert_true(taken >= 6);
    /* a token that is not allowed is refused and changes nothing */
    gram_match_mask(m, now);
    int32_t bad_id = -1;
    for (int32_t id = 0; id < tok_n_ids(tok) && bad_id < 0; id++)
        if (!bit(now, id) && !tok_is_special(tok, id)) bad_id = id;
    assert_true(bad_id >= 0);
    assert_int_not_equal(gram_match_accept(m, bad_id, &err), 0);
    assert_int_not_equal(gram_match_accept(m, eos_id, &err), 0); /* not complete */
    uint32_t *again = malloc(sizeof(uint32_t) * (size_t)W);
    gram_match_mask(m, again);
    assert_memory_equal(now, again, sizeof(uint32_t) * (size_t)W);
    /* roll back 1, 3, then to the start, comparing masks */
    assert_int_equal(gram_match_rollback(m, 1), 0);
    gram_match_mask(m, now);
    assert_memory_equal(now, masks + (size_t)W * (taken - 1), sizeof(uint32_t) * (size_t)W);
    assert_int_equal(gram_match_rollback(m, 3), 0);
    gram_match_mask(m, now);
    assert_memory_equal(now, masks + (size_t)W * (taken - 4), sizeof(uint32_t) * (size_t)W);
    /* a different continuation, then back again */
    gram_match_mask(m, now);
    int na = 0;
    for (int32_t id = 0; id < N_VOCAB; id++)
        if (bit(now, id) && id != eos_id) allowed[na++] = id;
    assert_int_equal(gram_match_accept(m, allowed[na - 1], &err), 0);
    assert_int_equal(gram_match_rollback(m, 1), 0);
    gram_match_mask(m, now);
    assert_memory_equal(now, masks + (size_t)W * (taken - 4), sizeof(uint32_t) * (size_t)W);
    assert_int_equal(gram_match_rollback(m, taken - 4), 0);
    gram_match_mask(m, now);
    assert_memory_equal(now, masks, sizeof(uint32_t) * (size_t)W);
    assert_int_not_equal(gram_match_rollback(m, 1), 0); /* nothing left to undo */
    gram_match_free(m);
    free(masks); free(now); free(again); free(allowed);
    gram_unref(g);
}

static void test_json_object(void **state)
{
    struct gram *g;
    struct rl_err err = {0};
    assert_int_equal(gram_compile_json_object(&g, voc, &err), 0);
    int ok = 0;
    for (int seed = 1; seed <= 6; seed++) {
        int steps;
        char *doc = walk(g, (uint64_t)seed, 4000, &steps);
        if (!doc) continue; /* a random walk may nest past the step budget */
        if (getenv("TEST_GRAMMAR_VERBOSE")) fprintf(stderr, "%d steps: %.300s\n", steps, doc);
        cJSON *v = cJSON_Parse(doc);
        if (!cJSON_IsObject(v)) fail_msg("seed %d: not a JSON object: %s", seed, doc);
        cJSON_Delete(v);
        free(doc);
        ok++;
    }
    assert_true(ok >= 3);
    gram_unref(g);
}

static void test_tool_call(void **state)
{
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
        "\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\","
        /* a: zod's .int() bounds, b: .positive() (issue 29: forced tool calls with them) */
        "\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991},\"b\":{\"type\":\"integer\",\"exclusiveMinimum\":0,\"maximum\":99}},"
        "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}}}]";
    cJSON *tj = cJSON_Parse(tools);
    for (int named = 0; named < 2; named++) {
        struct gram *g;
        struct rl_err err = {0};
        if (gram_compile_tool_call(&g, voc, tools, strlen(tools), named ? "add" : NULL, &err))
            fail_msg("tool call: %s", err.msg);
        int seen_names = 0;
        for (int seed = 1; seed <= 6; seed++) {
            int steps;
            char *doc = walk(g, (uint64_t)seed, 2000, &steps);
            assert_non_null(doc);
            if (getenv("TEST_GRAMMAR_VERBOSE")) fprintf(stderr, "%d steps: %s\n", steps, doc);
            size_t L = strlen(doc);
            assert_true(L > 26);
            assert_memory_equal(doc, "<tool_call>\n", 12);
            assert_string_equal(doc + L - 13, "\n</tool_call>");
            doc[L - 13] = 0;
            cJSON *v = cJSON_Parse(doc + 12);
            if (!v) fail_msg("tool call JSON: %s", doc + 12);
            const cJSON *nm = cJSON_GetObjectItem(v, "name"), *args = cJSON_GetObjectItem(v, "arguments");
            assert_true(cJSON_IsString(nm));
            int which = !strcmp(nm->valuestring, "add");
            if (named) assert_string_equal(nm->valuestring, "add");
            else assert_true(which || !strcmp(nm->valuestring, "get_weather"));
            seen_names |= 1 << which;
            const cJSON *ps = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(tj, which), "function"), "parameters");
            char why[200] = "";
            if (!validate(args, ps, ps, why, sizeof why)) fail_msg("arguments %s fail %s", doc + 12, why);
            cJSON_Delete(v);
            free(doc);
        }
        if (!named) assert_int_equal(seen_names, 3); /* both tools come up */
        gram_unref(g);
    }
    struct gram *g = NULL;
    struct rl_err err = {0};
    expect_refusal(gram_compile_tool_call(&g, voc, tools, strlen(tools), "nope", &err), &err, "tool nope",
                   "'nope', which is not among the tools");
    const char *badt = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"not\":{}}}}]";
    expect_refusal(gram_compile_tool_call(&g, voc, badt, strlen(badt), NULL, &err), &err, badt,
                   "/0/function/parameters/not: unsupported keyword");
    cJSON_Delete(tj);
}

/* A walk with no cmocka calls, for threads: the document or NULL. */
static char *walk_plain(struct gram *g, uint64_t seed, int max_steps)
{
    struct gram_match *m;
    struct rl_err err = {0};
    if (gram_match_create(&m, g, &err)) return NULL;
    uint32_t *mask = malloc(sizeof(uint32_t) * gram_mask_words_n(N_VOCAB));
    int32_t *allowed = malloc(sizeof(int32_t) * N_VOCAB);
    size_t cap = 1 << 16, n = 0;
    char *doc = malloc(cap);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    bool ended = false;
    for (int step = 0; step < max_steps && !ended; step++) {
        gram_match_mask(m, mask);
        int na = 0;
        for (int32_t id = 0; id < N_VOCAB; id++)
            if (bit(mask, id)) allowed[na++] = id;
        if (!na) break;
        int32_t id = allowed[rng_next(&s) % (uint64_t)na];
        if (gram_match_accept(m, id, &err)) break;
        if (tok_is_special(tok, id)) { ended = true; break; } /* an eos */
        size_t len;
        const char *b = tok_token_bytes(tok, id, &len);
        if (n + len + 1 > cap) break;
        memcpy(doc + n, b, len);
        n += len;
    }
    doc[n] = 0;
    free(mask); free(allowed);
    gram_match_free(m);
    if (!ended) { free(doc); return NULL; }
    return doc;
}

struct job { struct gram *g; uint64_t seed; char *doc; };
/* POSIX threads rather than C11's: GCC's ThreadSanitizer does not
 * intercept thrd_create (a thread it never set up crashes at its first
 * instrumented call), and these are the tests it should watch. */
static void *run_job(void *arg)
{
    struct job *j = arg;
    j->doc = walk_plain(j->g, j->seed, 3000);
    return NULL;
}

/* Both jobs' walks at once, one thread each. */
static void run_together(struct job jobs[2])
{
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

/* A schema whose states do not all fit the compile-time budget: the rest
 * are classified on first use, by whichever thread gets there first. Two
 * threads sharing one gram produce exactly what one thread alone does. */
static void test_threads_lazy(void **state)
{
    const char *js = "{\"type\":\"string\",\"minLength\":50,\"maxLength\":400}";
    char *alone[2];
    for (int i = 0; i < 2; i++) {
        struct gram *g = schema(js);
        alone[i] = walk_plain(g, (uint64_t)(i + 11), 3000);
        assert_non_null(alone[i]);
        gram_unref(g);
    }
    struct gram *g = schema(js);
    struct job jobs[2] = {{g, 11, NULL}, {g, 12, NULL}};
    run_together(jobs);
    for (int i = 0; i < 2; i++) {
        assert_non_null(jobs[i].doc);
        assert_string_equal(jobs[i].doc, alone[i]);
        cJSON *v = cJSON_Parse(jobs[i].doc);
        assert_true(cJSON_IsString(v));
        size_t n = utf8_chars(v->valuestring);
        if (n < 50 || n > 400) fail_msg("length %zu outside 50..400: %s", n, jobs[i].doc);
        cJSON_Delete(v);
        free(jobs[i].doc);
        free(alone[i]);
    }
    gram_unref(g);
}

/* gram_bytes counts what walks publish; a grammar whose mask budget is
 * spent computes the same masks without keeping them: the same walks give
 * the same documents, and its memory stays where it was. */
static void test_mask_budget(void **state)
{
    const char *js = "{\"type\":\"string\",\"minLength\":50,\"maxLength\":400}";
    struct gram *kept = schema(js), *spent = schema(js);
    size_t kept0 = gram_bytes(kept), spent0 = gram_bytes(spent);
    assert_true(spent0 > 400 * 1024); /* a state a position, 1 KB each at least */
    gram_set_mask_budget(spent, 0);
    for (uint64_t seed = 21; seed < 24; seed++) {
        char *a = walk_plain(kept, seed, 3000), *b = walk_plain(spent, seed, 3000);
        assert_non_null(a);
        assert_non_null(b);
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    assert_true(gram_bytes(kept) > kept0); /* the states the walks met */
    assert_int_equal(gram_bytes(spent), spent0);
    /* and on two threads at once, the transient masks freed by each */
    struct job jobs[2] = {{spent, 11, NULL}, {spent, 12, NULL}};
    run_together(jobs);
    for (int i = 0; i < 2; i++) {
        char *alone = walk_plain(kept, (uint64_t)(11 + i), 3000);
        assert_non_null(jobs[i].doc);
        assert_string_equal(jobs[i].doc, alone);
        free(alone);
        free(jobs[i].doc);
    }
    assert_int_equal(gram_bytes(spent), spent0);
    gram_unref(kept);
    gram_unref(spent);
}

/* 1 when text, tokenized, is a complete document; 0 when every token is
 * accepted but it is not complete; -1 when a token is refused. */
static int feed(struct gram *g, const char *text)
{
    struct tok_ids t = {0};
    struct rl_err err = {0};
    assert_int_equal(tok_encode(tok, text, strlen(text), TOK_ENCODE_NO_SPECIAL, &t, &err), 0);
    const int32_t *ids = t.ids;
    size_t n = t.n;
    struct gram_match *m;
    assert_int_equal(gram_match_create(&m, g, &err), 0);
    int r = 1;
    uint32_t *mask = malloc(sizeof(uint32_t) * gram_mask_words_n(N_VOCAB));
    for (size_t i = 0; i < n && r == 1; i++) {
        gram_match_mask(m, mask);
        int rc = gram_match_accept(m, ids[i], &err);
        if (bit(mask, ids[i]) != (rc == 0)) fail_msg("'%s' token %zu: mask %d but accept %d", text, i, bit(mask, ids[i]), rc);
        if (rc) r = -1;
    }
    if (r == 1 && !gram_match_complete(m)) r = 0;
    free(mask);
    tok_ids_free(&t);
    gram_match_free(m);
    return r;
}

/* Exact documents in and out of a schema's language. */
static void test_language(void **state)
{
    static const struct { const char *schema, *doc; int want; } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "-37", 1},
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "-38", -1},
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "1234", 1},
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "1235", -1},
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "0", 1},
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "007", -1},
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", "12", 1},
        {"{\"type\":\"integer\",\"minimum\":100}", "99", 0},
        {"{\"type\":\"integer\",\"minimum\":100}", "100", 1},
        {"{\"type\":\"number\"}", "-0.5e-12", 1},
        {"{\"type\":\"number\"}", "1e100", -1},      /* 3 exponent digits */
        {"{\"type\":\"number\"}", "12345678901234567", -1}, /* 17 digits */
        {"{\"type\":\"string\",\"pattern\":\"ab+c\"}", "\"zzabbbc!\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"ab+c\"}", "\"zzac\"", -1}, /* the closing quote is refused */
        {"{\"type\":\"string\",\"pattern\":\"^a(?:b|cd){2}$\"}", "\"acdb\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^a(?:b|cd){2}$\"}", "\"abbb\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"0000-01-01\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"0001-01-01\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2023-02-29\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"1900-02-29\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2000-02-29\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"0400-02-29\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-04-31\"", -1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-04-30\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-12-31\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-30\"", -1},
        /* issue 29: date-time is a date, "T", a time on every day (the
         * alternation of the date used to swallow "T" time into its leap-day
         * branch) */
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-15T10:20:30Z\"", 1},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-15\"", -1},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-02-29T00:00:00.5+01:00\"", 1},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2023-02-29T00:00:00Z\"", -1},
        /* issue 29: allOf with additionalProperties false in one member allows
         * only that member's properties (JSON Schema's rule: each member is
         * checked on its own) */
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false},{\"properties\":{\"b\":{\"type\":\"boolean\"}}}]}", "{\"a\": 1}", 1},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false},{\"properties\":{\"b\":{\"type\":\"boolean\"}}}]}", "{\"a\": 1, \"b\": true}", -1},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false},{\"properties\":{\"b\":{\"type\":\"boolean\"}}}]}", "{\"b\": true}", -1},
        /* issue 29: integer bounds to int64, exclusive bounds, multipleOf */
        {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", "9007199254740991", 1},
        {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", "9007199254740992", -1},
        {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", "-9007199254740991", 1},
        {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", "-9007199254740992", -1},
        {"{\"type\":\"integer\",\"minimum\":-1000000000000000}", "-1000000000000000", 1},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "0", -1},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "1", 1},
        {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":10,\"exclusiveMaximum\":true}", "10", -1},
        {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":10,\"exclusiveMaximum\":true}", "9", 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "0", 0},   /* only as the start of 0.x */
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "0.0", 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "0.25", 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "1", 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "1.5", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "-0.5", -1},
        {"{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.9}", "0.100", 1},
        {"{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.9}", "0.099", -1},
        {"{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.9}", "0.900", 1},
        {"{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.9}", "0.901", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0.1,\"maximum\":0.9}", "0.100", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-0.25,\"exclusiveMaximum\":0.25}", "-0.249", 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-0.25,\"exclusiveMaximum\":0.25}", "-0.250", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-0.25,\"exclusiveMaximum\":0.25}", "0", 1},
        {"{\"type\":\"number\",\"minimum\":1.5,\"maximum\":2.5}", "2", 1},
        {"{\"type\":\"number\",\"minimum\":1.5,\"maximum\":2.5}", "1.499", -1},
        {"{\"type\":\"number\",\"minimum\":1.5,\"maximum\":2.5}", "2.5", 0},
        {"{\"type\":\"number\",\"minimum\":1.5,\"maximum\":2.5}", "2.500", 1},
        {"{\"type\":\"integer\",\"multipleOf\":25}", "1275", 1},
        {"{\"type\":\"integer\",\"multipleOf\":25}", "-50", 1},
        {"{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":0,\"maximum\":100000}", "99975", 1},
        {"{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":0,\"maximum\":100000}", "99990", -1},
        {"{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":0,\"maximum\":100000}", "100025", -1},
        {"{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":0,\"maximum\":100000}", "25", 1},
        {"{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":0,\"maximum\":100000}", "-25", -1},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"uniqueItems\":true}", "[\"a\", \"b\"]", 1},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"uniqueItems\":true}", "[\"a\", \"a\"]", -1},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "\"https://example.com/a/b\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":3}", "\"abc\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":3}", "\"abcd\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":3}", "\"a\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":3}", "\"ab\"", 1},
        /* extra keys beside declared ones are longer than every declared name */
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"ab\": 1, \"xyz\": true}", 1},
        /* zod's catchall(z.never()): additionalProperties {"not": {}} lets none through */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"not\":{}}}", "{\"a\": 1}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"not\":{}}}", "{\"a\": 1, \"bb\": 2}", -1},
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"ab\": 1, \"ab\": true}", -1},
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"ab\": 1, \"\\u0061b\": true}", -1},
        {"{\"type\":\"integer\",\"multipleOf\":64}", "640", 1},
        /* a format beside any pattern: kept when the automata show every
         * string of the format (or of its narrow form) matches the pattern */
        {"{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^\\\\d{4}-\\\\d{2}-\\\\d{2}$\"}", "\"2024-02-29\"", 1},
        {"{\"type\":\"string\",\"format\":\"date-time\",\"pattern\":\"Z$\"}", "\"2024-01-15T10:20:30Z\"", 1},
        {"{\"type\":\"string\",\"format\":\"date-time\",\"pattern\":\"Z$\"}", "\"2024-01-15T10:20:30+01:00\"", -1},
        {"{\"type\":\"string\",\"format\":\"uuid\",\"pattern\":\"^[0-9a-f-]+$\"}", "\"123e4567-e89b-42d3-a456-426614174000\"", 1},
        {"{\"type\":\"string\",\"format\":\"uuid\",\"pattern\":\"^[0-9a-f-]+$\"}", "\"123E4567-e89b-42d3-a456-426614174000\"", -1},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", 1},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"a.b@example.com\"", 1},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"a.b@@example.com\"", -1},
        {"{\"type\":\"string\",\"maxLength\":3}", "\"\u00e9\u00e9\u00e9\"", 1}, /* characters, not bytes */
        {"{\"type\":\"string\",\"maxLength\":3}", "\"abcd\"", -1},
        /* a maxLength above 2,000 is written as 2,000 (Pydantic's AnyUrl: 65536) */
        {"{\"type\":\"string\",\"maxLength\":65536}", "\"abc\"", 1},
        {"{\"type\":\"string\"}", "\"tab\\there \\u00e9 \\\" ok\"", 1},
        {"{\"type\":\"string\"}", "\"raw\ttab\"", -1}, /* a control character unescaped */
        /* whitespace: at most one space after ',' and ':' */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{\"a\": 1, \"b\": true}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{\"a\":1,\"b\":true}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{\"a\":  1}", -1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{ \"a\":1}", -1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{\"b\":true}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}}}", "{\"b\":true,\"a\":1}", -1}, /* schema order */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{}", -1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{\"a\":1,\"c\":2}", -1},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\": 1, \"y\": 2}", 1},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"x\": true}", -1},
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}},\"additionalProperties\":true}", "{\"s\": \"v\", \"kk\": [null, {\"z\": 1.5}]}", 1},
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}},\"additionalProperties\":true}", "{\"s\": \"v\", \"k\": 1}", -1}, /* extra keys: longer than the declared */
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}}}", "{\"s\": \"v\", \"k\": 1}", -1}, /* absent: none generated */
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"string\"},\"minItems\":2}", "[1, \"a\", \"b\"]", 1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"string\"},\"minItems\":2}", "[1]", -1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"string\"},\"minItems\":2}", "[\"a\", 1]", -1},
        {"{\"$defs\":{\"t\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"$ref\":\"#/$defs/t\"}", "[[], [[[]]], []]", 1},
        {"{\"$defs\":{\"t\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"$ref\":\"#/$defs/t\"}", "[[], [[[]], []]", 0},
        {"{\"oneOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"string\",\"minLength\":4}]}", "\"abc\"", -1},
        {"{\"oneOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"string\",\"minLength\":4}]}", "\"abcd\"", 1},
    };
    struct gram *g = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (!i || strcmp(cases[i].schema, cases[i - 1].schema)) { /* one compile per run of cases */
            gram_unref(g);
            g = schema(cases[i].schema);
        }
        int r = feed(g, cases[i].doc);
        if (r != cases[i].want) fail_msg("%s on %s: %d, want %d", cases[i].doc, cases[i].schema, r, cases[i].want);
    }
    gram_unref(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_refusals),
        cmocka_unit_test(test_ebnf_refusals),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_tool_call),
        cmocka_unit_test(test_threads_lazy),
        cmocka_unit_test(test_mask_budget),
        cmocka_unit_test(test_language),
        cmocka_unit_test(test_ebnf_walk),
        cmocka_unit_test(test_schema_walks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
