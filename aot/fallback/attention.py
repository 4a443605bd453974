"""Attention as one kernel: each block of query rows' scores stay in cache.

``softmax(scale q k^T + mask) v`` per batch and head (q ``[L, D]``, k ``[S, D]``, v
``[S, Dv]``, any strides with the last dimension dense; an additive float mask
broadcast to the scores). The three oneDNN primitives it replaces write all the
scores (MobileViT-S: 4 MB per attention) and read them back twice; here each work
item (a batch, a head, ``_CHUNK`` query rows) copies k transposed and v padded to
whole vectors of 16 floats into its thread's work buffer, then takes 8 query rows at
a time: their scores (8 x S floats, in L1), the softmax, and the product with v.

The exponential is a degree-5 polynomial of ``2^f`` times ``2^n`` (relative error
1.6e-7), exactly 0 below ``exp(-86.6)`` so that no denormal is ever made (a causal
mask's ``-inf`` scores made half of Llama's denormal, each a microcode assist: its
program ran 50.9 ms against 28.1 before this); sums are float32 in another order than oneDNN's: results differ by rounding
(6e-7 to 8e-7 of the largest against a float64 reference). A NaN in a row's scores
makes that row NaN, and a row masked whole (all ``-inf``) is NaN, as in torch.

The C source (``_SOURCE``) is compiled once per process by ``c_compiler`` for this CPU
(OpenMP over work items); ``available()`` is false where no compiler works, and
``dnnl_program`` times it against oneDNN's primitives per shape before using it.
"""

from __future__ import annotations

import ctypes as C
import functools

from . import c_compiler, c_vectors

__all__ = ["available", "Attention"]

_CHUNK = 32  # query rows of one work item
_QB, _VL = 8, 16  # (as in the source) query rows at a time; floats in a vector

_SOURCE = c_vectors.PRELUDE + r"""
#define QB 8  /* query rows computed together */

/* exp(x) for x <= 0; 0 below -86.6 (2^-125: no denormal is ever made, whose
   arithmetic costs microcode assists: a causal mask's -inf scores would otherwise make
   half of them denormal); a NaN stays NaN */
static inline vf vexp(vf x) {
    vf t = x * 1.44269504088896341f;
    const vf lo = bc(-125.f);
    vi small = t < lo; /* (false for a NaN) */
    t = sel(small, lo, t);
#ifdef __AVX512F__
    vf n = (vf)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    const vf magic = bc(12582912.f);
    vf n = (t + magic) - magic;
#endif
    vf f = t - n;
    vf p = f * 1.327640959e-03f + 9.675526991e-03f;
    p = p * f + 5.550713465e-02f;
    p = p * f + 2.402212024e-01f;
    p = p * f + 6.931469440e-01f;
    p = p * f + 1.000000119e+00f;
#ifdef __AVX512F__
    vf v = (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    vf v = p * (vf)e;
#endif
    return sel(small, bc(0.f), v);
}

static inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < VL; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

static inline float hsum(vf v) {
    float s = 0.f;
    for (int i = 0; i < VL; ++i) s += v[i];
    return s;
}

struct aot_attn_args {
    const float *q, *k, *v, *mask;
    float *o, *work;
    long B, H, L, S, D, Dv;
    long qs[3], ks[3], vs[3], os[3]; /* batch, head, row strides (the last dimension dense) */
    long ms[4];                      /* the mask's batch, head, row, column strides (0: broadcast) */
    long threads, per_thread;        /* work: per_thread floats for each of threads */
    long chunk;                      /* query rows of one work item */
    float scale;
};

/* scores sc[i][j] = scale q_i . k_j (+ mask), for QB rows and NV vectors of keys at j */
#define QK(NV)                                                                          \
    {                                                                                   \
        vf acc[QB][NV];                                                                 \
        for (int i = 0; i < QB; ++i)                                                    \
            for (int u = 0; u < NV; ++u) acc[i][u] = (vf){};                            \
        for (long d = 0; d < D; ++d) {                                                  \
            vf kv[NV];                                                                  \
            for (int u = 0; u < NV; ++u) kv[u] = ld(kt + d * Sp + j + u * VL);          \
            for (int i = 0; i < QB; ++i) {                                              \
                vf s = bc(qr[i][d]);                                                    \
                for (int u = 0; u < NV; ++u) acc[i][u] += s * kv[u];                    \
            }                                                                           \
        }                                                                               \
        for (int i = 0; i < QB; ++i)                                                    \
            for (int u = 0; u < NV; ++u) st(sc + i * Sp + j + u * VL, acc[i][u] * scale); \
    }

/* out rows += p . v for QB rows and NV vectors of v's columns at c */
#define PV(NV)                                                                          \
    {                                                                                   \
        vf acc[QB][NV];                                                                 \
        for (int i = 0; i < QB; ++i)                                                    \
            for (int u = 0; u < NV; ++u) acc[i][u] = (vf){};                            \
        for (long j = 0; j < S; ++j) {                                                  \
            vf vv[NV];                                                                  \
            for (int u = 0; u < NV; ++u) vv[u] = ld(vp + j * Dvp + c + u * VL);         \
            for (int i = 0; i < QB; ++i) {                                              \
                vf p = bc(sc[i * Sp + j]);                                              \
                for (int u = 0; u < NV; ++u) acc[i][u] += p * vv[u];                    \
            }                                                                           \
        }                                                                               \
        for (int i = 0; i < nr; ++i) {                                                  \
            float *orow = o + b * os[0] + h * os[1] + (r0 + i) * os[2];                 \
            for (int u = 0; u < NV; ++u) {                                              \
                vf r = acc[i][u] * inv[i];                                              \
                long c0 = c + u * VL;                                                   \
                if (c0 + VL <= Dv)                                                      \
                    st(orow + c0, r);                                                   \
                else                                                                    \
                    for (long e = c0; e < Dv; ++e) orow[e] = r[e - c0];                 \
            }                                                                           \
        }                                                                               \
    }

/* o = softmax(scale q k^T + mask) v per batch and head: q [L, D], k [S, D], v [S, Dv],
   o [L, Dv] at the given strides. Each work item (a batch, a head, `chunk` query rows)
   copies k transposed and v padded to whole vectors into its thread's work, then
   computes QB rows at a time: their scores (in the work, in cache), the softmax, and
   their products with v. Returns 0. */
int aot_attention_run(const struct aot_attn_args *a) {
    const long B = a->B, H = a->H, L = a->L, S = a->S, D = a->D, Dv = a->Dv;
    const long Sp = (S + VL - 1) / VL * VL, Dvp = (Dv + VL - 1) / VL * VL;
    const long nchunk = (L + a->chunk - 1) / a->chunk, items = B * H * nchunk;
    const float scale = a->scale;
    int nt = omp_get_max_threads();
    nt = nt < a->threads ? nt : (int)a->threads;
#pragma omp parallel num_threads(nt)
    {
        float *kt = a->work + omp_get_thread_num() * a->per_thread; /* [D][Sp] */
        float *vp = kt + D * Sp;                                    /* [S][Dvp] */
        float *sc = vp + S * Dvp;                                   /* [QB][Sp] */
        long have = -1;                                             /* the batch x head there */
#pragma omp for schedule(static)
        for (long it = 0; it < items; ++it) {
            long bh = it / nchunk, b = bh / H, h = bh % H;
            long rb = (it % nchunk) * a->chunk, re = rb + a->chunk < L ? rb + a->chunk : L;
            if (bh != have) {
                const float *kb = a->k + b * a->ks[0] + h * a->ks[1];
                const long kr = a->ks[2];
                for (long d = 0; d < D; ++d) {
                    float *kd = kt + d * Sp;
                    for (long j = 0; j < S; ++j) kd[j] = kb[j * kr + d];
                    for (long j = S; j < Sp; ++j) kd[j] = 0.f;
                }
                const float *vb = a->v + b * a->vs[0] + h * a->vs[1];
                for (long j = 0; j < S; ++j) {
                    memcpy(vp + j * Dvp, vb + j * a->vs[2], Dv * sizeof(float));
                    for (long c = Dv; c < Dvp; ++c) vp[j * Dvp + c] = 0.f;
                }
                have = bh;
            }
            float *o = a->o;
            const long *os = a->os;
            for (long r0 = rb; r0 < re; r0 += QB) {
                int nr = re - r0 < QB ? (int)(re - r0) : QB;
                const float *qr[QB];
                for (int i = 0; i < QB; ++i)
                    qr[i] = a->q + b * a->qs[0] + h * a->qs[1] + (r0 + (i < nr ? i : nr - 1)) * a->qs[2];
                long j = 0;
                for (; j + 2 * VL <= Sp; j += 2 * VL) QK(2)
                for (; j < Sp; j += VL) QK(1)
                float inv[QB];
                for (int i = 0; i < nr; ++i) {
                    float *row = sc + i * Sp;
                    if (a->mask) {
                        const float *mr = a->mask + b * a->ms[0] + h * a->ms[1] + (r0 + i) * a->ms[2];
                        if (a->ms[3] == 1)
                            for (long jj = 0; jj < S; ++jj) row[jj] += mr[jj];
                        else
                            for (long jj = 0; jj < S; ++jj) row[jj] += mr[jj * a->ms[3]];
                    }
                    for (long jj = S; jj < Sp; ++jj) row[jj] = -__builtin_inff();
                    vf m = ld(row);
                    for (long jj = VL; jj < Sp; jj += VL) {
                        vf x = ld(row + jj);
                        m = sel(x > m, x, m);
                    }
                    float mx = hmax(m);
                    vf sum = (vf){};
                    for (long jj = 0; jj < Sp; jj += VL) {
                        vf e = vexp(ld(row + jj) - mx);
                        st(row + jj, e);
                        sum += e;
                    }
                    inv[i] = 1.f / hsum(sum);
                }
                for (int i = nr; i < QB; ++i) inv[i] = 0.f;
                long c = 0;
                for (; c + 2 * VL <= Dvp; c += 2 * VL) PV(2)
                for (; c < Dvp; c += VL) PV(1)
            }
        }
    }
    return 0;
}

int aot_attention_threads(void) { return omp_get_max_threads(); }
"""



class _Args(C.Structure):
    _fields_ = [(n, C.c_void_p) for n in ("q", "k", "v", "mask", "o", "work")] + [
        (n, C.c_long) for n in ("B", "H", "L", "S", "D", "Dv")] + [
        (n, C.c_long * 3) for n in ("qs", "ks", "vs", "os")] + [("ms", C.c_long * 4)] + [
        (n, C.c_long) for n in ("threads", "per_thread", "chunk")] + [("scale", C.c_float)]


def _lib():
    return _build(c_vectors.FLAGS)


@functools.cache
def _build(flags: tuple):
    return c_compiler.load_kernel(_SOURCE, flags, "the attention kernel", "aot_attention_run")


def available() -> bool:
    """The kernel compiled in this process."""
    return _lib() is not None


def _round(n: int) -> int:
    return -(-n // _VL) * _VL


class Attention:
    """One attention over ``b`` batches of ``h`` heads: ``l`` queries and ``s`` keys of
    ``d`` floats, values of ``dv``. ``strides(q, k, v, o, mask)`` gives each operand's
    (batch, head, row) strides in floats (the mask's (batch, head, row, column), 0
    where it is broadcast; None: no mask). ``work()`` is the work buffer's size in
    floats (``bind``: one may serve many, the caller runs one at a time). ``kernel`` and
    ``args`` are the C call ``__call__`` makes, for a caller's own loop, once the
    operands' addresses are set (``point``)."""

    def __init__(self, b: int, h: int, l: int, s: int, d: int, dv: int, scale: float):
        self._lib = _lib()
        if self._lib is None:
            raise ValueError("the attention kernel is not available in this process")
        if min(b, h, l, s, d, dv) < 1:
            raise ValueError(f"an attention of {(b, h, l, s, d, dv)} has nothing to do")
        self.threads = max(1, self._lib.aot_attention_threads())
        per = d * _round(s) + s * _round(dv) + _QB * _round(s)
        self.a = _Args(B=b, H=h, L=l, S=s, D=d, Dv=dv, threads=self.threads,
                       per_thread=per, chunk=_CHUNK, scale=scale)
        self.args = C.addressof(self.a)
        self.kernel = C.cast(self._lib.aot_attention_run, C.c_void_p).value
        self.masked = False

    def strides(self, q, k, v, o, mask=None) -> None:
        for name, st in (("qs", q), ("ks", k), ("vs", v), ("os", o)):
            getattr(self.a, name)[:] = list(st)
        self.masked = mask is not None
        if self.masked:
            self.a.ms[:] = list(mask)

    def work(self) -> int:
        return self.threads * self.a.per_thread

    def bind(self, work) -> None:
        """A work buffer (a float32 tensor) of at least ``work()`` floats."""
        self._work = work
        self.a.work = work.data_ptr()

    def point(self, q: int, k: int, v: int, o: int, mask: int | None = None) -> None:
        """The operands' addresses."""
        self.a.q, self.a.k, self.a.v, self.a.o = q, k, v, o
        self.a.mask = mask if self.masked else None

    def run(self) -> None:
        self._lib.aot_attention_run(self.args)

    def __call__(self, q: int, k: int, v: int, o: int, mask: int | None = None) -> None:
        self.point(q, k, v, o, mask)
        self.run()
