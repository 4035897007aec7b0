/* worker.core._peek: the common provider event read without building its whole object.
 *
 * Nearly every record of a stream is one text delta or one argument fragment of an open run.
 * `Assembler.feed_record` used to parse each with `orjson.loads`, building a dict for the
 * envelope, one for the event and more for its nested members, only to read five or six of
 * them. `peek(value)` parses the record with yyjson (the parser orjson itself uses, vendored
 * here: vendor/yyjson) into yyjson's own document, and builds Python objects for
 * the members the fast path reads only.
 *
 * It answers a tuple `(kind, run_id, seq, ts, index, text)` for the six shapes below, and
 * None for anything else: the caller then parses the record with orjson and takes the
 * general path, so a None is never wrong, only slower. A tuple is an answer only when
 *   - the record is one JSON document that orjson reads too (yyjson, strict RFC 8259 with its
 *     UTF-8 and surrogate checks, at most PEEK_MAX_DEPTH deep and PEEK_MAX_BYTES long: orjson
 *     allows more of both, and the rest falls to orjson), and
 *   - every member that the general path reads for that record is read here, with the JSON
 *     type the general path requires; a member it reads that appears twice in its object
 *     (orjson keeps the last) gives None.
 * docs/decisions/0008-peek.md says why; tests/core/property/test_peek.py compares every answer
 * with orjson's parse, and tests/core/property/test_fast_paths.py the outputs.
 *
 * The shapes (the envelope: "type" is "provider.event", "run_id" a string, "v" the integer 1,
 * "seq" an integer, "ts" absent, null or a non-negative integer, "event" an object):
 *   1 ANTHROPIC_TEXT  event.type "content_block_delta", event.index an index (an integer
 *                     >= 0, as every index below), event.delta an object whose type is
 *                     "text_delta" and text a string;
 *   2 ANTHROPIC_JSON  the same with delta.type "input_json_delta" and partial_json a string;
 *   3 CHAT_TEXT       event.choices an array of one object, whose index is absent or 0,
 *                     finish_reason absent or null, and delta an object of one member,
 *                     "content", a non-empty string (index: 0);
 *   4 CHAT_ARGS       the same choice whose delta's one member is "tool_calls", an array of
 *                     one object: index an index, id absent or null, function an object
 *                     with arguments a string and name absent or null;
 *   5 RESPONSES_TEXT  event.type "response.output_text.delta", output_index an index,
 *                     delta a string;
 *   6 RESPONSES_ARGS  event.type "response.function_call_arguments.delta", output_index an
 *                     index, delta a string;
 *   7 RESPONSES_INPUT the same with event.type "response.custom_tool_call_input.delta" (an
 *                     item's type decides which delta it takes: the adapter tells them apart).
 * An index of another type (true, 1.0, "1") or a negative one is no shape: every adapter
 * refuses it, at every event (issue 23).
 * Whether the shape is one the run's adapter takes, and what it does with it, is the
 * adapter's `fast` (worker/core/ops.py), which may still say None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "yyjson.h"

#define PEEK_MAX_BYTES 16384

enum {
    ANTHROPIC_TEXT = 1,
    ANTHROPIC_JSON = 2,
    CHAT_TEXT = 3,
    CHAT_ARGS = 4,
    RESPONSES_TEXT = 5,
    RESPONSES_ARGS = 6,
    RESPONSES_INPUT = 7,
};

/* One pool for every parse: a record is at most PEEK_MAX_BYTES, so yyjson never needs more
 * (yyjson_read_max_memory_usage), and no parse calls malloc. The GIL serialises the calls. */
static void *pool_buf = NULL;
static yyjson_alc pool;

/* The members of one object that a shape reads: each name's value, NULL when absent. */
typedef struct {
    const char *name;
    size_t len;
    yyjson_val *val;
} member;

#define M(s) {s, sizeof(s) - 1, NULL}

/* Find `members` in `obj`; false when one of them appears twice (orjson keeps the last, and
 * such a record is left to it). */
static int
read_members(yyjson_val *obj, member *members, size_t n)
{
    yyjson_obj_iter it;
    yyjson_val *key;
    yyjson_obj_iter_init(obj, &it);
    while ((key = yyjson_obj_iter_next(&it)) != NULL) {
        size_t len = unsafe_yyjson_get_len(key);
        const char *name = unsafe_yyjson_get_str(key);
        for (size_t i = 0; i < n; i++) {
            if (members[i].len == len && memcmp(members[i].name, name, len) == 0) {
                if (members[i].val != NULL)
                    return 0;
                members[i].val = yyjson_obj_iter_get_val(key);
                break;
            }
        }
    }
    return 1;
}

static int
is_str(yyjson_val *val, const char *s, size_t len)
{
    return val != NULL && yyjson_equals_strn(val, s, len);
}

#define IS(val, lit) is_str((val), lit, sizeof(lit) - 1)

static int
is_int(yyjson_val *val)
{
    return val != NULL && (yyjson_is_uint(val) || yyjson_is_sint(val));
}

/* An index: a JSON integer >= 0 (yyjson's uint), never a bool, a real or a negative. */
static int
is_index(yyjson_val *val)
{
    return val != NULL && yyjson_is_uint(val);
}

static int
absent_or_null(yyjson_val *val)
{
    return val == NULL || yyjson_is_null(val);
}

static PyObject *
new_int(yyjson_val *val)
{
    if (yyjson_is_uint(val))
        return PyLong_FromUnsignedLongLong(yyjson_get_uint(val));
    return PyLong_FromLongLong(yyjson_get_sint(val));
}

static PyObject *
new_str(yyjson_val *val)
{
    return PyUnicode_DecodeUTF8(unsafe_yyjson_get_str(val), unsafe_yyjson_get_len(val),
                                NULL);
}

/* The chat choice of shapes 3 and 4: its delta's one member, and that member's name. */
static int
chat_choice(yyjson_val *choices, yyjson_val **delta_member, int *is_content)
{
    if (!yyjson_is_arr(choices) || yyjson_arr_size(choices) != 1)
        return 0;
    yyjson_val *choice = yyjson_arr_get_first(choices);
    if (!yyjson_is_obj(choice))
        return 0;
    member m[] = {M("index"), M("delta"), M("finish_reason")};
    if (!read_members(choice, m, 3))
        return 0;
    yyjson_val *index = m[0].val, *delta = m[1].val;
    if (!(index == NULL || (yyjson_is_uint(index) && yyjson_get_uint(index) == 0)))
        return 0;
    if (!absent_or_null(m[2].val) || !yyjson_is_obj(delta) || yyjson_obj_size(delta) != 1)
        return 0;
    yyjson_obj_iter it;
    yyjson_obj_iter_init(delta, &it);
    yyjson_val *key = yyjson_obj_iter_next(&it);
    *delta_member = yyjson_obj_iter_get_val(key);
    if (IS(key, "content")) {
        *is_content = 1;
        return 1;
    }
    *is_content = 0;
    return IS(key, "tool_calls");
}

/* The shape of `event`, with its index and text; 0 for none of the six. */
static int
event_shape(yyjson_val *event, yyjson_val **index_out, yyjson_val **text_out)
{
    member m[] = {M("type"), M("index"), M("delta"), M("output_index"), M("choices")};
    if (!read_members(event, m, 5))
        return 0;
    yyjson_val *type = m[0].val, *delta = m[2].val;
    if (IS(type, "content_block_delta")) {
        if (!is_index(m[1].val) || !yyjson_is_obj(delta))
            return 0;
        member d[] = {M("type"), M("text"), M("partial_json")};
        if (!read_members(delta, d, 3))
            return 0;
        *index_out = m[1].val;
        if (IS(d[0].val, "text_delta") && yyjson_is_str(d[1].val)) {
            *text_out = d[1].val;
            return ANTHROPIC_TEXT;
        }
        if (IS(d[0].val, "input_json_delta") && yyjson_is_str(d[2].val)) {
            *text_out = d[2].val;
            return ANTHROPIC_JSON;
        }
        return 0;
    }
    if (type != NULL && yyjson_is_str(type)) {
        int kind = IS(type, "response.output_text.delta") ? RESPONSES_TEXT
                   : IS(type, "response.function_call_arguments.delta") ? RESPONSES_ARGS
                   : IS(type, "response.custom_tool_call_input.delta") ? RESPONSES_INPUT
                   : 0;
        if (kind) {
            if (!is_index(m[3].val) || !yyjson_is_str(delta))
                return 0;
            *index_out = m[3].val;
            *text_out = delta;
            return kind;
        }
    }
    /* Chat reads "choices" whatever "type" says: the run's adapter decides whose it is. */
    yyjson_val *member_val = NULL;
    int is_content = 0;
    if (m[4].val == NULL || !chat_choice(m[4].val, &member_val, &is_content))
        return 0;
    if (is_content) {
        if (!yyjson_is_str(member_val) || unsafe_yyjson_get_len(member_val) == 0)
            return 0;
        *index_out = NULL;
        *text_out = member_val;
        return CHAT_TEXT;
    }
    if (!yyjson_is_arr(member_val) || yyjson_arr_size(member_val) != 1)
        return 0;
    yyjson_val *entry = yyjson_arr_get_first(member_val);
    if (!yyjson_is_obj(entry))
        return 0;
    member e[] = {M("index"), M("id"), M("function")};
    if (!read_members(entry, e, 3))
        return 0;
    if (!is_index(e[0].val) || !absent_or_null(e[1].val) || !yyjson_is_obj(e[2].val))
        return 0;
    member f[] = {M("arguments"), M("name")};
    if (!read_members(e[2].val, f, 2))
        return 0;
    if (!yyjson_is_str(f[0].val) || !absent_or_null(f[1].val))
        return 0;
    *index_out = e[0].val;
    *text_out = f[0].val;
    return CHAT_ARGS;
}

static PyObject *
answer(yyjson_doc *doc)
{
    yyjson_val *root = yyjson_doc_get_root(doc);
    if (!yyjson_is_obj(root))
        return NULL;
    member m[] = {M("type"), M("run_id"), M("v"), M("seq"), M("ts"), M("event")};
    if (!read_members(root, m, 6))
        return NULL;
    yyjson_val *run_id = m[1].val, *v = m[2].val, *seq = m[3].val, *ts = m[4].val;
    if (!IS(m[0].val, "provider.event") || !yyjson_is_str(run_id) || !is_int(seq))
        return NULL;
    if (!(v != NULL && yyjson_is_uint(v) && yyjson_get_uint(v) == 1))
        return NULL;
    if (!(absent_or_null(ts) || yyjson_is_uint(ts)) || !yyjson_is_obj(m[5].val))
        return NULL;
    yyjson_val *index = NULL, *text = NULL;
    int kind = event_shape(m[5].val, &index, &text);
    if (!kind)
        return NULL;
    PyObject *tuple = PyTuple_New(6);
    if (tuple == NULL)
        return NULL;
    PyObject *items[6] = {
        PyLong_FromLong(kind),
        new_str(run_id),
        new_int(seq),
        absent_or_null(ts) ? Py_NewRef(Py_None) : new_int(ts),
        index == NULL ? PyLong_FromLong(0) : new_int(index),
        new_str(text),
    };
    for (int i = 0; i < 6; i++) {
        if (items[i] == NULL) {  /* out of memory: nothing half-built is answered */
            for (int j = i; j < 6; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, items[i]);
    }
    return tuple;
}

static PyObject *
peek(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg))  /* the caller's own type check is orjson's */
        Py_RETURN_NONE;
    char *data = PyBytes_AS_STRING(arg);
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    if (len == 0 || len > PEEK_MAX_BYTES)
        Py_RETURN_NONE;
    yyjson_doc *doc = yyjson_read_opts(data, (size_t)len, 0, &pool, NULL);
    if (doc == NULL)
        Py_RETURN_NONE;
    PyObject *result = answer(doc);
    yyjson_doc_free(doc);
    if (result == NULL) {
        PyErr_Clear();  /* an answer not built (out of memory) is no answer */
        Py_RETURN_NONE;
    }
    return result;
}

static PyMethodDef methods[] = {
    {"peek", peek, METH_O,
     "peek(value: bytes) -> (kind, run_id, seq, ts, index, text) | None\n\n"
     "The common provider event read without building its whole object; None for anything "
     "else (worker/core/csrc/peek.c)."},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    if (pool_buf == NULL) {
        size_t size = yyjson_read_max_memory_usage(PEEK_MAX_BYTES, 0);
        pool_buf = PyMem_RawMalloc(size);
        if (pool_buf == NULL || !yyjson_alc_pool_init(&pool, pool_buf, size)) {
            PyErr_NoMemory();
            return -1;
        }
    }
    const struct { const char *name; long value; } constants[] = {
        {"ANTHROPIC_TEXT", ANTHROPIC_TEXT}, {"ANTHROPIC_JSON", ANTHROPIC_JSON},
        {"CHAT_TEXT", CHAT_TEXT}, {"CHAT_ARGS", CHAT_ARGS},
        {"RESPONSES_TEXT", RESPONSES_TEXT}, {"RESPONSES_ARGS", RESPONSES_ARGS},
        {"RESPONSES_INPUT", RESPONSES_INPUT},
        {"MAX_BYTES", PEEK_MAX_BYTES}, {"MAX_DEPTH", YYJSON_READER_DEPTH_LIMIT},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++) {
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0)
            return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "worker.core._peek",
    "The common provider event read without building its whole object "
    "(worker/core/csrc/peek.c).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__peek(void)
{
    return PyModuleDef_Init(&module_def);
}
