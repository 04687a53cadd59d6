/* One decoding step's attention for a batch of rows, fused: softmax(q·Kᵀ·scale + mask)·V.
 *
 * Built and called by r1trade/cpu/decode_kernel.py, which says why it exists. Compiled per model shape:
 * GROUPS query heads share each key/value head, HEAD_DIM numbers per head (a multiple of 16). For each row and
 * key/value head (one task; tasks are split between the threads) the GROUPS queries are scored against the keys
 * of an optional shared prefix and then of the row's own cache, one softmax runs over all of those columns, and
 * the values are summed with its weights. Every key and value is read once per task, and a column the mask rules
 * out (additive value -FLT_MAX, as r1trade's masks use) is not read at all.
 *
 * Layouts (each column's HEAD_DIM numbers are contiguous, as in a KV-cache buffer):
 *   query   (rows, kv_heads, GROUPS, HEAD_DIM) float, contiguous, not yet scaled
 *   prefix  keys/values (kv_heads, prefix_len, HEAD_DIM), head stride prefix_head_stride; shared by all rows
 *   own     keys/values (rows, kv_heads, own_len, HEAD_DIM), row and head strides given per tensor
 *   mask    (rows, prefix_len + own_len) float, additive, contiguous; NULL = every column
 *   out     (rows, kv_heads, GROUPS, HEAD_DIM) float, contiguous
 * Keys and values are floats, or with -DKV_BF16 bfloat16 (a model run in bfloat16 caches them so): each is widened
 * to float as it is read (exact: a bfloat16 is a float's upper 16 bits), and every sum is a float sum, so a step
 * reads half the bytes and computes as the float build does.
 * Returns 0, or 1 when the scratch memory for the scores could not be allocated.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef GROUPS
#error "compile with -DGROUPS=<query heads per key/value head>"
#endif
#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=<numbers per head, a multiple of 16>"
#endif

#define LANES 16
#define CHUNKS (HEAD_DIM / LANES)
#define PREFETCH_COLUMNS 16 /* ~4 KB ahead at HEAD_DIM 64: the hardware prefetchers stop at page boundaries */

#if HEAD_DIM % LANES != 0
#error "HEAD_DIM must be a multiple of 16"
#endif

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef float unaligned_vec __attribute__((vector_size(LANES * sizeof(float)), aligned(sizeof(float))));

static inline vec load(const float *p) { return *(const unaligned_vec *)p; }
static inline void store(float *p, vec x) { *(unaligned_vec *)p = x; }

#ifdef KV_BF16
typedef uint16_t kv_t; /* bfloat16 bits */
typedef uint16_t unaligned_kv_vec __attribute__((vector_size(LANES * sizeof(uint16_t)), aligned(sizeof(uint16_t))));
typedef uint32_t wide_vec __attribute__((vector_size(LANES * sizeof(uint32_t))));
/* LANES bfloat16 as floats: zero-extend each to 32 bits and shift it into the upper half */
static inline vec load_kv(const kv_t *p) {
    return (vec)(__builtin_convertvector(*(const unaligned_kv_vec *)p, wide_vec) << 16);
}
#else
typedef float kv_t;
static inline vec load_kv(const kv_t *p) { return load(p); }
#endif
#define KV_PER_LINE (64 / (int)sizeof(kv_t)) /* numbers per 64-byte cache line */

/* a[low] + a[high] over the 32 lanes of (a, b): each step halves the partial sums per column */
#define FOLD(a, b, ...) (__builtin_shufflevector(a, b, __VA_ARGS__))
#define LOW1 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HIGH1 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LOW2 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define HIGH2 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LOW3 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define HIGH3 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LOW4 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define HIGH4 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31

/* Lane c of the result is the sum of the lanes of x[c]: 16 vectors of partial dot products become 16 scores in
 * 15 shuffle-and-add steps instead of 16 separate horizontal sums. */
static inline vec transpose_sum(const vec *x) {
    vec pairs[8], quads[4], octets[2];
    for (int i = 0; i < 8; i++) pairs[i] = FOLD(x[2 * i], x[2 * i + 1], LOW1) + FOLD(x[2 * i], x[2 * i + 1], HIGH1);
    for (int i = 0; i < 4; i++)
        quads[i] = FOLD(pairs[2 * i], pairs[2 * i + 1], LOW2) + FOLD(pairs[2 * i], pairs[2 * i + 1], HIGH2);
    for (int i = 0; i < 2; i++)
        octets[i] = FOLD(quads[2 * i], quads[2 * i + 1], LOW3) + FOLD(quads[2 * i], quads[2 * i + 1], HIGH3);
    return FOLD(octets[0], octets[1], LOW4) + FOLD(octets[0], octets[1], HIGH4);
}

/* Column j of a task: the prefix's columns come first, then the row's own. */
static inline const kv_t *column(const kv_t *prefix, const kv_t *own, int64_t prefix_len, int64_t j) {
    return j < prefix_len ? prefix + j * HEAD_DIM : own + (j - prefix_len) * HEAD_DIM;
}

/* Column j, after asking for the one PREFETCH_COLUMNS further on to be brought into the cache. */
static inline const kv_t *fetch(const kv_t *prefix, const kv_t *own, int64_t prefix_len, int64_t j,
                                int64_t columns) {
    if (j + PREFETCH_COLUMNS < columns) {
        const kv_t *ahead = column(prefix, own, prefix_len, j + PREFETCH_COLUMNS);
        for (int i = 0; i < HEAD_DIM; i += KV_PER_LINE) __builtin_prefetch(ahead + i);
    }
    return column(prefix, own, prefix_len, j);
}

/* One row and key/value head. `scores` holds GROUPS × `stride` floats (stride ≥ columns, a multiple of LANES). */
static void attend(const float *query, const kv_t *prefix_keys, const kv_t *prefix_values, const kv_t *keys,
                   const kv_t *values, int64_t prefix_len, int64_t columns, const float *mask, float scale,
                   float *scores, int64_t stride, float *out) {
    vec q[GROUPS][CHUNKS];
    for (int g = 0; g < GROUPS; g++)
        for (int c = 0; c < CHUNKS; c++) q[g][c] = load(query + g * HEAD_DIM + c * LANES) * scale;

    /* scores, LANES columns at a time; masked columns and those past the end score -FLT_MAX unread */
    for (int64_t start = 0; start < columns; start += LANES) {
        vec partial[GROUPS][LANES];
        float added[LANES];
        for (int lane = 0; lane < LANES; lane++) {
            int64_t j = start + lane;
            added[lane] = j >= columns ? -FLT_MAX : mask ? mask[j] : 0.0f;
            if (added[lane] == -FLT_MAX) {
                for (int g = 0; g < GROUPS; g++) partial[g][lane] = (vec){0};
                continue;
            }
            const kv_t *key = fetch(prefix_keys, keys, prefix_len, j, columns);
            vec k[CHUNKS];
            for (int c = 0; c < CHUNKS; c++) k[c] = load_kv(key + c * LANES);
            for (int g = 0; g < GROUPS; g++) {
                vec sum = q[g][0] * k[0];
                for (int c = 1; c < CHUNKS; c++) sum += q[g][c] * k[c];
                partial[g][lane] = sum;
            }
        }
        vec add = load(added);
        for (int g = 0; g < GROUPS; g++) store(scores + g * stride + start, transpose_sum(partial[g]) + add);
    }

    /* softmax weights, not yet normalised: exp(score - max); a masked column's is exp(-FLT_MAX - max) = 0 */
    float total[GROUPS];
    for (int g = 0; g < GROUPS; g++) {
        float *row = scores + g * stride, highest = -FLT_MAX, sum = 0.0f;
        for (int64_t j = 0; j < columns; j++) highest = row[j] > highest ? row[j] : highest;
        for (int64_t j = 0; j < columns; j++) {
            float e = expf(row[j] - highest);
            row[j] = e;
            sum += e;
        }
        total[g] = sum;
    }

    vec acc[GROUPS][CHUNKS];
    for (int g = 0; g < GROUPS; g++)
        for (int c = 0; c < CHUNKS; c++) acc[g][c] = (vec){0};
    for (int64_t j = 0; j < columns; j++) {
        if (mask && mask[j] == -FLT_MAX) continue;
        const kv_t *value = fetch(prefix_values, values, prefix_len, j, columns);
        vec v[CHUNKS];
        for (int c = 0; c < CHUNKS; c++) v[c] = load_kv(value + c * LANES);
        for (int g = 0; g < GROUPS; g++) {
            float weight = scores[g * stride + j];
            for (int c = 0; c < CHUNKS; c++) acc[g][c] += weight * v[c];
        }
    }
    /* a row that attends to nothing (every column masked) sums no value: zeros */
    for (int g = 0; g < GROUPS; g++) {
        float norm = total[g] > 0.0f ? 1.0f / total[g] : 0.0f;
        for (int c = 0; c < CHUNKS; c++) store(out + g * HEAD_DIM + c * LANES, acc[g][c] * norm);
    }
}

int r1trade_decode_attention(const float *query, const kv_t *prefix_keys, const kv_t *prefix_values,
                             int64_t prefix_head_stride, int64_t prefix_len, const kv_t *keys,
                             int64_t key_row_stride, int64_t key_head_stride, const kv_t *values,
                             int64_t value_row_stride, int64_t value_head_stride, int64_t own_len,
                             const float *mask, float scale, float *out, int64_t rows, int64_t kv_heads,
                             int threads) {
    const int64_t columns = prefix_len + own_len, stride = (columns + LANES - 1) / LANES * LANES;
    const int64_t tasks = rows * kv_heads;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *scores = aligned_alloc(64, sizeof(float) * GROUPS * (stride > 0 ? stride : LANES));
        failed = scores == NULL;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            if (failed) continue;
            const int64_t row = task / kv_heads, head = task % kv_heads;
            attend(query + task * GROUPS * HEAD_DIM, prefix_len ? prefix_keys + head * prefix_head_stride : NULL,
                   prefix_len ? prefix_values + head * prefix_head_stride : NULL, keys + row * key_row_stride + head * key_head_stride,
                   values + row * value_row_stride + head * value_head_stride, prefix_len, columns,
                   mask ? mask + row * columns : NULL, scale, scores, stride, out + task * GROUPS * HEAD_DIM);
        }
        free(scores);
    }
    return failed;
}
