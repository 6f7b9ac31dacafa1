/* refitctl manifest llama CONFIG.json [--tp N] [--pad-unit U]
 *
 * Writes the model manifest of a Llama-family checkpoint (a Hugging Face
 * config.json) for a worker of a TP group of N: q/k/v fused into one qkv
 * runtime tensor and gate/up into gate_up, column-parallel rows split over
 * the ranks, o_proj and down_proj row-parallel, the vocabulary padded to a
 * multiple of U x N rows and split too (vLLM's vocab-parallel embedding),
 * norms replicated. Shards name no rank: each worker takes its context's.
 * Runtime shapes are one rank's; splits must be even. The YAML is written
 * through libyaml's emitter (ctl_manifest_yaml.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tools/cli.h"
#include "tools/ctl/ctl_manifest_yaml.h"
#include "tools/refitctl.h"

typedef struct llama {
    long hidden, inter, layers, heads, kv_heads, head_dim, vocab, tp, vocab_pad;
    int tied;
} llama;

static int cfg_int(json_t *cfg, const char *key, long *out, const char *path)
{
    json_t *v = json_object_get(cfg, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0) {
        fprintf(stderr, "refitctl manifest: %s: \"%s\" must be a positive integer\n", path, key);
        return -1;
    }
    *out = (long)json_integer_value(v);
    return 0;
}

static int llama_read(llama *m, const char *path)
{
    json_error_t jerr;
    json_t *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!cfg) {
        fprintf(stderr, "refitctl manifest: %s:%d:%d: %s\n", path, jerr.line, jerr.column,
                jerr.text);
        return -1;
    }
    int rc = cfg_int(cfg, "hidden_size", &m->hidden, path) ||
             cfg_int(cfg, "intermediate_size", &m->inter, path) ||
             cfg_int(cfg, "num_hidden_layers", &m->layers, path) ||
             cfg_int(cfg, "num_attention_heads", &m->heads, path) ||
             cfg_int(cfg, "vocab_size", &m->vocab, path);
    m->kv_heads = m->heads;
    if (!rc && json_object_get(cfg, "num_key_value_heads"))
        rc = cfg_int(cfg, "num_key_value_heads", &m->kv_heads, path);
    m->head_dim = m->heads ? m->hidden / m->heads : 0;
    if (!rc && json_is_integer(json_object_get(cfg, "head_dim")))
        rc = cfg_int(cfg, "head_dim", &m->head_dim, path);
    m->tied = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    json_decref(cfg);
    return rc ? -1 : 0;
}

static int llama_check(const llama *m, const char *path)
{
    const char *bad = m->heads % m->tp ? "num_attention_heads"
                    : m->kv_heads % m->tp ? "num_key_value_heads"
                    : m->inter % m->tp ? "intermediate_size"
                    : m->hidden % m->tp ? "hidden_size" : NULL;
    if (bad) {
        fprintf(stderr, "refitctl manifest: %s: %s is not a multiple of --tp %ld\n", path, bad,
                m->tp);
        return -1;
    }
    return 0;
}

/* {name: N, dtype: bf16, shape: [rows(, cols)]}: cols 0 for a vector. */
static void runtime_entry(ymw *y, const char *name, long rows, long cols)
{
    ymw_map(y, 1);
    ymw_kv_str(y, "name", name);
    ymw_kv_str(y, "dtype", "bf16");
    ymw_str(y, "shape");
    ymw_seq(y, 1);
    ymw_int(y, rows);
    if (cols)
        ymw_int(y, cols);
    ymw_end_seq(y);
    ymw_end_map(y);
}

/* A module's name, format and the start of its runtime list. */
static void module_begin(ymw *y, const char *name)
{
    ymw_map(y, 0);
    ymw_kv_str(y, "name", name);
    ymw_kv_str(y, "format", "unquantized");
    ymw_str(y, "runtime");
    ymw_seq(y, 0);
}

/* Between the runtime list and the checkpoint list. */
static void module_checkpoint(ymw *y)
{
    ymw_end_seq(y);
    ymw_str(y, "checkpoint");
    ymw_seq(y, 0);
}

static void module_end(ymw *y)
{
    ymw_end_seq(y);
    ymw_end_map(y);
}

/* The keys of a checkpoint entry after its name: dtype, shape, target
 * (NULL: none), the shard over the ranks along dim (dim < 0: replicated),
 * the fuse offset (0: none) and the padded rows (0: none). */
static void ckpt_keys(ymw *y, const llama *m, long rows, long cols, const char *target, int dim,
                      long offset, long pad_to)
{
    ymw_kv_str(y, "dtype", "bf16");
    ymw_str(y, "shape");
    ymw_seq(y, 1);
    ymw_int(y, rows);
    if (cols)
        ymw_int(y, cols);
    ymw_end_seq(y);
    if (target)
        ymw_kv_str(y, "target", target);
    if (dim >= 0 && m->tp > 1) {
        ymw_str(y, "shard");
        ymw_map(y, 1);
        ymw_kv_int(y, "dim", dim);
        ymw_kv_int(y, "count", m->tp);
        ymw_end_map(y);
    }
    if (offset) {
        ymw_str(y, "fuse");
        ymw_map(y, 1);
        ymw_str(y, "dst_offset");
        ymw_seq(y, 1);
        ymw_int(y, offset);
        ymw_end_seq(y);
        ymw_end_map(y);
    }
    if (pad_to) {
        ymw_str(y, "padding");
        ymw_map(y, 1);
        ymw_kv_int(y, "pad_to", pad_to);
        ymw_end_map(y);
    }
}

/* The vocabulary-parallel table (embedding or lm_head): rows padded and
 * split over the ranks. */
static void vocab_ckpt(ymw *y, const llama *m, const char *name)
{
    ymw_map(y, 0);
    ymw_kv_str(y, "name", name);
    ckpt_keys(y, m, m->vocab, m->hidden, NULL, 0, 0,
              m->vocab_pad != m->vocab ? m->vocab_pad : 0);
    ymw_end_map(y);
}

static void emit_embed(ymw *y, const llama *m)
{
    module_begin(y, "embed");
    runtime_entry(y, "table", m->vocab_pad / m->tp, m->hidden);
    module_checkpoint(y);
    vocab_ckpt(y, m, "model.embed_tokens.weight");
    if (m->tied) {
        ymw_map(y, 0);
        ymw_kv_str(y, "name", "lm_head.weight");
        ymw_kv_str(y, "tie", "model.embed_tokens.weight");
        ymw_end_map(y);
    }
    module_end(y);
}

static void emit_lm_head(ymw *y, const llama *m)
{
    if (m->tied)
        return;
    module_begin(y, "lm_head");
    runtime_entry(y, "weight", m->vocab_pad / m->tp, m->hidden);
    module_checkpoint(y);
    vocab_ckpt(y, m, "lm_head.weight");
    module_end(y);
}

/* One checkpoint tensor of a layer: split over the ranks along dim (< 0:
 * replicated), at offset rows of its fused target. */
static void layer_ckpt(ymw *y, const llama *m, const char *name, long rows, long cols,
                       const char *target, int dim, long offset)
{
    char full[128];
    snprintf(full, sizeof full, "model.layers.${l}.%s.weight", name);
    ymw_map(y, 0);
    ymw_kv_str(y, "name", full);
    ckpt_keys(y, m, rows, cols, target, dim, offset, 0);
    ymw_end_map(y);
}

static void emit_layers(ymw *y, const llama *m)
{
    long q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim, tp = m->tp;
    ymw_map(y, 0);
    ymw_str(y, "repeat");
    ymw_map(y, 1);
    ymw_kv_str(y, "var", "l");
    ymw_kv_int(y, "count", m->layers);
    ymw_end_map(y);
    ymw_str(y, "modules");
    ymw_seq(y, 0);

    module_begin(y, "layers.${l}.attn");
    runtime_entry(y, "qkv", (q + 2 * kv) / tp, m->hidden);
    runtime_entry(y, "o", m->hidden, q / tp);
    module_checkpoint(y);
    layer_ckpt(y, m, "self_attn.q_proj", q, m->hidden, "qkv", 0, 0);
    layer_ckpt(y, m, "self_attn.k_proj", kv, m->hidden, "qkv", 0, q / tp);
    layer_ckpt(y, m, "self_attn.v_proj", kv, m->hidden, "qkv", 0, (q + kv) / tp);
    layer_ckpt(y, m, "self_attn.o_proj", m->hidden, q, "o", 1, 0);
    module_end(y);

    module_begin(y, "layers.${l}.mlp");
    runtime_entry(y, "gate_up", 2 * m->inter / tp, m->hidden);
    runtime_entry(y, "down", m->hidden, m->inter / tp);
    module_checkpoint(y);
    layer_ckpt(y, m, "mlp.gate_proj", m->inter, m->hidden, "gate_up", 0, 0);
    layer_ckpt(y, m, "mlp.up_proj", m->inter, m->hidden, "gate_up", 0, m->inter / tp);
    layer_ckpt(y, m, "mlp.down_proj", m->hidden, m->inter, "down", 1, 0);
    module_end(y);

    module_begin(y, "layers.${l}.norms");
    runtime_entry(y, "input", m->hidden, 0);
    runtime_entry(y, "post_attention", m->hidden, 0);
    module_checkpoint(y);
    layer_ckpt(y, m, "input_layernorm", m->hidden, 0, "input", -1, 0);
    layer_ckpt(y, m, "post_attention_layernorm", m->hidden, 0, "post_attention", -1, 0);
    module_end(y);

    ymw_end_seq(y);
    ymw_end_map(y);
}

static void emit_norm(ymw *y, const llama *m)
{
    module_begin(y, "norm");
    runtime_entry(y, "weight", m->hidden, 0);
    module_checkpoint(y);
    ymw_map(y, 0);
    ymw_kv_str(y, "name", "model.norm.weight");
    ckpt_keys(y, m, m->hidden, 0, NULL, -1, 0, 0);
    ymw_end_map(y);
    module_end(y);
}

/* The whole manifest on stdout; the config path and the name given are
 * written as quoted strings (any bytes of UTF-8 read back as given). */
static int emit_manifest(const llama *m, const char *config, const char *name, long unit)
{
    ymw y;
    if (ymw_open(&y, stdout) == 0) {
        size_t n = strlen(config) + strlen(name) + 128;
        char *doc = malloc(n);
        if (!doc)
            return fprintf(stderr, "refitctl manifest: out of memory\n"), 1;
        snprintf(doc, n, "Generated by `refitctl manifest llama %s --tp %ld --pad-unit %ld "
                 "--name %s`.", config, m->tp, unit, name);
        ymw_map(&y, 0);
        ymw_str(&y, "doc");
        ymw_text(&y, doc);
        ymw_kv_str(&y, "kind", "model");
        ymw_str(&y, "name");
        ymw_text(&y, name);
        ymw_str(&y, "modules");
        ymw_seq(&y, 0);
        emit_embed(&y, m);
        emit_layers(&y, m);
        emit_norm(&y, m);
        emit_lm_head(&y, m);
        ymw_end_seq(&y);
        ymw_end_map(&y);
        free(doc);
    }
    if (ymw_close(&y) || fflush(stdout)) {
        fprintf(stderr, "refitctl manifest: %s: %s\n", config,
                y.failed ? y.err : "writing stdout failed");
        return 1;
    }
    return 0;
}

static const cli_opt manifest_opts[] = {
    {"tp", 't', "N", "the tensor-parallel group's size (default 1): shapes are one rank's"},
    {"pad-unit", 'p', "U", "pad the vocabulary to a multiple of U x N rows (default 64)"},
    {"name", 'n', "NAME", "the model's name in the manifest (default llama); any UTF-8 text"},
    {NULL, 0, NULL, NULL},
};

static const cli manifest_cli = {
    "refitctl manifest", "llama CONFIG.json [--tp N] [--pad-unit U] [--name NAME]",
    "Writes on stdout the model manifest of a Llama-family checkpoint (a Hugging\n"
    "Face config.json) for one worker of a TP group of N: q/k/v fused into qkv,\n"
    "gate/up into gate_up, column-parallel rows split over the ranks, o_proj and\n"
    "down_proj row-parallel, the vocabulary padded and split, norms replicated.\n"
    "Exit status: 0 written, 1 a config it cannot use, 2 usage.",
    manifest_opts,
};

typedef struct manifest_args {
    long tp, unit;
    const char *name;
} manifest_args;

static int manifest_opt(void *user, int key, const char *v)
{
    manifest_args *a = user;
    if (key == 'n') {
        a->name = v;
        return 0;
    }
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n <= 0 || n > 1 << 20)
        return cli_usage_error(&manifest_cli, "--%s needs a positive integer, not '%s'",
                               key == 't' ? "tp" : "pad-unit", v);
    *(key == 't' ? &a->tp : &a->unit) = n;
    return 0;
}

int ctl_manifest(int argc, char **argv)
{
    manifest_args a = {1, 64, "llama"};
    int first, rc = cli_parse(&manifest_cli, argc, argv, manifest_opt, &a, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (argc - first != 2 || strcmp(argv[first], "llama"))
        return cli_usage_error(&manifest_cli, argc - first < 1 || strcmp(argv[first], "llama")
                                                  ? "the one family is llama"
                                                  : "llama takes one CONFIG.json");
    const char *config = argv[first + 1];
    llama m;
    memset(&m, 0, sizeof m);
    m.tp = a.tp;
    long unit = a.unit;
    if (llama_read(&m, config) || llama_check(&m, config))
        return 1;
    long step = unit * m.tp;
    m.vocab_pad = (m.vocab + step - 1) / step * step;
    return emit_manifest(&m, config, a.name, unit);
}
