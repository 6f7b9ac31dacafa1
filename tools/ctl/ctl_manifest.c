/* refitctl manifest llama CONFIG.json [--tp N] [--pad-unit U]
 *
 * Writes the model manifest of a Llama-family checkpoint (a Hugging Face
 * config.json) for a worker of a TP group of N: q/k/v fused into one qkv
 * runtime tensor and gate/up into gate_up, column-parallel rows split over
 * the ranks, o_proj and down_proj row-parallel, the vocabulary padded to a
 * multiple of U x N rows and split too (vLLM's vocab-parallel embedding),
 * norms replicated. Shards name no rank: each worker takes its context's.
 * Runtime shapes are one rank's; splits must be even. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tools/cli.h"
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

static void emit_embed(const llama *m)
{
    printf("  - name: embed\n    format: unquantized\n    runtime:\n"
           "      - {name: table, dtype: bf16, shape: [%ld, %ld]}\n    checkpoint:\n"
           "      - name: model.embed_tokens.weight\n        dtype: bf16\n"
           "        shape: [%ld, %ld]\n",
           m->vocab_pad / m->tp, m->hidden, m->vocab, m->hidden);
    if (m->tp > 1)
        printf("        shard: {dim: 0, count: %ld}\n", m->tp);
    if (m->vocab_pad != m->vocab)
        printf("        padding: {pad_to: %ld}\n", m->vocab_pad);
    if (m->tied)
        printf("      - name: lm_head.weight\n        tie: model.embed_tokens.weight\n");
}

static void emit_lm_head(const llama *m)
{
    if (m->tied)
        return;
    printf("  - name: lm_head\n    format: unquantized\n    runtime:\n"
           "      - {name: weight, dtype: bf16, shape: [%ld, %ld]}\n    checkpoint:\n"
           "      - name: lm_head.weight\n        dtype: bf16\n        shape: [%ld, %ld]\n",
           m->vocab_pad / m->tp, m->hidden, m->vocab, m->hidden);
    if (m->tp > 1)
        printf("        shard: {dim: 0, count: %ld}\n", m->tp);
    if (m->vocab_pad != m->vocab)
        printf("        padding: {pad_to: %ld}\n", m->vocab_pad);
}

/* One checkpoint tensor of a layer: split over the ranks along dim. */
static void emit_sharded(const llama *m, const char *name, long rows, long cols,
                         const char *target, int dim, long offset)
{
    printf("          - name: model.layers.${l}.%s.weight\n            dtype: bf16\n"
           "            shape: [%ld, %ld]\n            target: %s\n",
           name, rows, cols, target);
    if (m->tp > 1)
        printf("            shard: {dim: %d, count: %ld}\n", dim, m->tp);
    if (offset)
        printf("            fuse: {dst_offset: [%ld]}\n", offset);
}

static void emit_layers(const llama *m)
{
    long q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim, tp = m->tp;
    printf("  - repeat: {var: l, count: %ld}\n    modules:\n", m->layers);
    printf("      - name: layers.${l}.attn\n        format: unquantized\n        runtime:\n"
           "          - {name: qkv, dtype: bf16, shape: [%ld, %ld]}\n"
           "          - {name: o, dtype: bf16, shape: [%ld, %ld]}\n        checkpoint:\n",
           (q + 2 * kv) / tp, m->hidden, m->hidden, q / tp);
    emit_sharded(m, "self_attn.q_proj", q, m->hidden, "qkv", 0, 0);
    emit_sharded(m, "self_attn.k_proj", kv, m->hidden, "qkv", 0, q / tp);
    emit_sharded(m, "self_attn.v_proj", kv, m->hidden, "qkv", 0, (q + kv) / tp);
    emit_sharded(m, "self_attn.o_proj", m->hidden, q, "o", 1, 0);
    printf("      - name: layers.${l}.mlp\n        format: unquantized\n        runtime:\n"
           "          - {name: gate_up, dtype: bf16, shape: [%ld, %ld]}\n"
           "          - {name: down, dtype: bf16, shape: [%ld, %ld]}\n        checkpoint:\n",
           2 * m->inter / tp, m->hidden, m->hidden, m->inter / tp);
    emit_sharded(m, "mlp.gate_proj", m->inter, m->hidden, "gate_up", 0, 0);
    emit_sharded(m, "mlp.up_proj", m->inter, m->hidden, "gate_up", 0, m->inter / tp);
    emit_sharded(m, "mlp.down_proj", m->hidden, m->inter, "down", 1, 0);
    printf("      - name: layers.${l}.norms\n        format: unquantized\n        runtime:\n"
           "          - {name: input, dtype: bf16, shape: [%ld]}\n"
           "          - {name: post_attention, dtype: bf16, shape: [%ld]}\n"
           "        checkpoint:\n"
           "          - {name: \"model.layers.${l}.input_layernorm.weight\", dtype: bf16,\n"
           "             shape: [%ld], target: input}\n"
           "          - {name: \"model.layers.${l}.post_attention_layernorm.weight\", "
           "dtype: bf16,\n             shape: [%ld], target: post_attention}\n",
           m->hidden, m->hidden, m->hidden, m->hidden);
}

static const cli_opt manifest_opts[] = {
    {"tp", 't', "N", "the tensor-parallel group's size (default 1): shapes are one rank's"},
    {"pad-unit", 'p', "U", "pad the vocabulary to a multiple of U x N rows (default 64)"},
    {NULL, 0, NULL, NULL},
};

static const cli manifest_cli = {
    "refitctl manifest", "llama CONFIG.json [--tp N] [--pad-unit U]",
    "Writes on stdout the model manifest of a Llama-family checkpoint (a Hugging\n"
    "Face config.json) for one worker of a TP group of N: q/k/v fused into qkv,\n"
    "gate/up into gate_up, column-parallel rows split over the ranks, o_proj and\n"
    "down_proj row-parallel, the vocabulary padded and split, norms replicated.\n"
    "Exit status: 0 written, 1 a config it cannot use, 2 usage.",
    manifest_opts,
};

typedef struct manifest_args {
    long tp, unit;
} manifest_args;

static int manifest_opt(void *user, int key, const char *v)
{
    manifest_args *a = user;
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
    manifest_args a = {1, 64};
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
    printf("# Generated by `refitctl manifest llama %s --tp %ld --pad-unit %ld`.\n"
           "kind: model\nname: llama\n\nmodules:\n", config, m.tp, unit);
    emit_embed(&m);
    emit_layers(&m);
    printf("  - name: norm\n    format: unquantized\n    runtime:\n"
           "      - {name: weight, dtype: bf16, shape: [%ld]}\n    checkpoint:\n"
           "      - {name: model.norm.weight, dtype: bf16, shape: [%ld]}\n",
           m.hidden, m.hidden);
    emit_lm_head(&m);
    return 0;
}
