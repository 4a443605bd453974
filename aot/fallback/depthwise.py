"""Depthwise convolutions with their activation and the squeeze-excitation's mean in one pass.

A depthwise convolution (one group per channel, ``[C, 1, K, K]`` weights, K 3 or 5,
stride 1 or 2, padding K // 2, NHWC float32 images, C a multiple of 16) computes its
channels 16 at a time and its pixels four at a time, adds the bias and applies the
activation (SiLU, a clip such as ReLU or ReLU6, hardswish) while they are in registers.
Images up to 16 wide (whose padded copy fits in 64 KB) are taken whole per 16
channels from a copy with their zero padding (no edge cases in the loop: 7x7 and
14x14 images are mostly edges); others row by row. Where a mean over the image follows (the squeeze-excitation of
MobileNetV3 and EfficientNet blocks), the sums are kept as the results are written
and the means come from them, instead of a pooling reading the whole result back.

Measured on a 2-core Xeon (AVX-512), EfficientNet-B0's layers with the SiLU and the
mean, against oneDNN's depthwise convolution and its pooling after (weights cycled
through 64 MB as in ``dnnl_program``'s timing): 32@112 0.091 ms against 0.181, 144@56
0.113 against 0.215, 96@112 (stride 2) 0.152 against 0.207, 672@14 (5x5) 0.059 against
0.068, 1152@7 (5x5) 0.028 against 0.035; its 12 shapes 0.73 ms against 1.12. Each
layer is still timed at build against oneDNN's (``dnnl_program``).

The SiLU's exponential is a degree-5 polynomial of ``2^f`` times ``2^n`` (relative
error 1.6e-7) and its reciprocal a 14-bit estimate with one Newton step (AVX-512), or
a division (other CPUs): values differ from oneDNN's by rounding, 3e-7 of the largest
here. The C source (``_SOURCE``) is compiled once per process by ``c_compiler`` for this
CPU, OpenMP over rows or images and channel blocks; ``available()`` is false where no
compiler works.
"""

from __future__ import annotations

import ctypes as C
import functools

import torch

from . import c_compiler, c_vectors

__all__ = ["available", "fits", "Conv", "ACTS"]

ACTS = {None: 0, "silu": 1, "clip": 2, "hardswish": 3}  # what may follow the bias

_CHANNELS = 64  # channels of one work item (rows x channel blocks are shared out)

_SOURCE = c_vectors.PRELUDE + r"""
#define CB 16
#define OB 4
#define IMG_W 16          /* images up to this wide are taken whole (dw_image) */
#define IMG_FLOATS 16384  /* where their padded copy fits in this (64 KB of stack) */

/* silu(v) = v / (1 + exp(-v)) */
#ifdef __AVX512F__
static inline vf vsilu(vf v) {
    /* exp(-v) = 2^t, t = -v log2(e) clamped to +-126 (2^t stays finite; beyond it the
       sigmoid is 0 or 1 in float32), = 2^n 2^f: n = round(t), 2^f by a degree-5
       polynomial on |f| <= 1/2 (relative error 1.6e-7) */
    __m512 t = _mm512_mul_ps((__m512)v, _mm512_set1_ps(-1.44269504088896341f));
    __mmask16 finite = _mm512_cmp_ps_mask(t, _mm512_set1_ps(126.f), _CMP_LE_OQ);
    t = _mm512_range_ps(t, _mm512_set1_ps(126.f), 2);  /* |t| <= 126, sign kept */
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.327640959e-03f), f, _mm512_set1_ps(9.675526991e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550713465e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402212024e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931469440e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.000000119e+00f));
    __m512 d = _mm512_add_ps(_mm512_scalef_ps(p, n), _mm512_set1_ps(1.f));
    __m512 q = _mm512_rcp14_ps(d);  /* 1 / d: 14 bits, then one Newton step */
    /* beyond 2^126 the sigmoid is 0 (v * 0: -0, or NaN for -inf and NaN, as torch's) */
    q = _mm512_maskz_mul_ps(finite, q, _mm512_fnmadd_ps(d, q, _mm512_set1_ps(2.f)));
    return (vf)_mm512_mul_ps((__m512)v, q);
}
#else
/* exp(x) for the SiLU: Cephes' polynomial on x - n ln2, times 2^n; 0 below -87.3, inf
   above 88.7 (as expf); a NaN in gives some number out (the SiLU keeps the NaN) */
static inline vf vexp(vf x) {
    const vf z = {}, lo = z - 87.3f, hi = z + 88.7f, magic = z + 12582912.f;
    vf xc = sel(x < lo, lo, sel(x > hi, hi, x));
    vf n = (xc * 1.44269504088896341f + magic) - magic;
    vf r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    vf v = p * (vf)e;
    v = sel(x < lo, z, v);
    return sel(x > hi, z + __builtin_inff(), v);  /* silu: v / inf is -0, or NaN for -inf */
}
static inline vf vsilu(vf v) { return v / (1.f + vexp(-v)); }
#endif

/* v clipped to [lo, hi]; a NaN stays */
static inline vf vclip(vf v, float lo, float hi) {
    return sel(v < bc(lo), bc(lo), sel(v > bc(hi), bc(hi), v));
}

/* the activation of OB results */
static inline __attribute__((always_inline)) void activate(vf *acc, int act, float lo,
                                                            float hi) {
    if (act == 1) {
#pragma GCC unroll 8
        for (int o = 0; o < OB; ++o) acc[o] = vsilu(acc[o]);
    } else if (act == 2) {
#pragma GCC unroll 8
        for (int o = 0; o < OB; ++o) acc[o] = vclip(acc[o], lo, hi);
    } else if (act == 3) {  /* hardswish: v * clip(v / 6 + 1 / 2, 0, 1) */
#pragma GCC unroll 8
        for (int o = 0; o < OB; ++o)
            acc[o] = acc[o] * vclip(acc[o] * (1.f / 6.f) + 0.5f, 0.f, 1.f);
    }
}

/* one output row's channels [c0, c1) of a K x K depthwise convolution, stride S */
static inline __attribute__((always_inline)) void dw_row(
        const float *x, long H, long W, long C, const float *w, const float *bias,
        const int K, const int S, long P, long oh, long OW, long c0, long c1, float *y,
        int act, float lo, float hi, float *rsum) {
    long ih0 = oh * S - P;
    int kh0 = ih0 < 0 ? (int)-ih0 : 0, kh1 = ih0 + K > H ? (int)(H - ih0) : K;
    for (long c = c0; c < c1; c += CB) {
        vf sum = {}, b = bias ? ld(bias + c) : (vf){};
        for (long ow0 = 0; ow0 < OW; ow0 += OB) {
            vf acc[OB];
#pragma GCC unroll 8
            for (int o = 0; o < OB; ++o) acc[o] = b;
            int nb = OW - ow0 < OB ? (int)(OW - ow0) : OB;
            long iw0 = ow0 * S - P;
            if (iw0 >= 0 && iw0 + (OB - 1) * S + K <= W && nb == OB) {
                for (int kh = kh0; kh < kh1; ++kh) {
                    const float *xr = x + ((ih0 + kh) * W + iw0) * C + c;
                    const float *wr = w + (long)kh * K * C + c;
#pragma GCC unroll 5
                    for (int kw = 0; kw < K; ++kw) {
                        vf wv = ld(wr + kw * C);
#pragma GCC unroll 8
                        for (int o = 0; o < OB; ++o) acc[o] += ld(xr + (o * S + kw) * C) * wv;
                    }
                }
            } else {
                for (int kh = kh0; kh < kh1; ++kh) {
                    const float *xr = x + (ih0 + kh) * W * C + c;
                    const float *wr = w + (long)kh * K * C + c;
#pragma GCC unroll 5
                    for (int kw = 0; kw < K; ++kw) {
                        vf wv = ld(wr + kw * C);
#pragma GCC unroll 8
                        for (int o = 0; o < OB; ++o) {
                            long iw = iw0 + o * S + kw;
                            if (o < nb && (unsigned long)iw < (unsigned long)W)
                                acc[o] += ld(xr + iw * C) * wv;
                        }
                    }
                }
            }
            activate(acc, act, lo, hi);
#pragma GCC unroll 8
            for (int o = 0; o < OB; ++o) {
                if (o >= nb) break;
                st(y + (ow0 + o) * C + c, acc[o]);
                sum += acc[o];
            }
        }
        if (rsum) st(rsum + c, sum);
    }
}


/* channels [c, c + 16) of one small image: copied with its zero padding into buf
   (PH x PW x 16 floats, PH = (OH - 1) S + K, PW = (whole blocks of OB outputs - 1) S + K),
   then every output block reads inside it; mean: the sums over the image, scaled (the
   caller's rows buffer: the means go where asked once every image is read) */
static inline __attribute__((always_inline)) void dw_image(
        const float *x, long H, long W, long C, const float *w, const float *bias,
        const int K, const int S, long P, long OH, long OW, long c, float *y, int act,
        float lo, float hi, float *mean, float scale, float *buf) {
    long nblk = (OW + OB - 1) / OB, PW = (nblk * OB - 1) * S + K, PH = (OH - 1) * S + K;
    const vf z = {};
    for (long r = 0; r < PH; ++r) {
        long ih = r - P;
        for (long q = 0; q < PW; ++q) {
            long iw = q - P;
            st(buf + (r * PW + q) * CB, ih >= 0 && ih < H && iw >= 0 && iw < W
                                         ? ld(x + (ih * W + iw) * C + c) : z);
        }
    }
    vf sum = z, b = bias ? ld(bias + c) : z;
    for (long oh = 0; oh < OH; ++oh) {
        for (long ow0 = 0; ow0 < OW; ow0 += OB) {
            vf acc[OB];
#pragma GCC unroll 8
            for (int o = 0; o < OB; ++o) acc[o] = b;
            for (int kh = 0; kh < K; ++kh) {
                const float *br = buf + ((oh * S + kh) * PW + ow0 * S) * CB;
                const float *wr = w + (long)kh * K * C + c;
#pragma GCC unroll 5
                for (int kw = 0; kw < K; ++kw) {
                    vf wv = ld(wr + kw * C);
#pragma GCC unroll 8
                    for (int o = 0; o < OB; ++o) acc[o] += ld(br + (o * S + kw) * CB) * wv;
                }
            }
            activate(acc, act, lo, hi);
            int nb = OW - ow0 < OB ? (int)(OW - ow0) : OB;
#pragma GCC unroll 8
            for (int o = 0; o < OB; ++o) {
                if (o >= nb) break;
                st(y + (oh * OW + ow0 + o) * C + c, acc[o]);
                sum += acc[o];
            }
        }
    }
    if (mean) st(mean + c, sum * scale);
}

#define IMG_CASE(KK, SS)                                                                \
    if (K == KK && S == SS) {                                                           \
        _Pragma("omp for schedule(static)")                                             \
        for (long it = 0; it < N * nv; ++it) {                                          \
            long n = it / nv, c = (it % nv) * CB;                                       \
            dw_image(x + n * H * W * C, H, W, C, w, bias, KK, SS, P, OH, OW, c,         \
                     y + n * OH * OW * C, act, lo, hi, rows ? rows + n * C : 0, a->scale, \
                     buf);                                                              \
        }                                                                               \
    }

#define DW_CASE(KK, SS)                                                                 \
    if (K == KK && S == SS) {                                                           \
        _Pragma("omp for schedule(static)")                                             \
        for (long it = 0; it < items; ++it) {                                           \
            long q = it % nq, r = it / nq, oh = r % OH, n = r / OH;                     \
            long c0 = q * cw, c1 = c0 + cw < C ? c0 + cw : C;                           \
            dw_row(x + n * H * W * C, H, W, C, w, bias, KK, SS, P, oh, OW, c0, c1,      \
                   y + (n * OH + oh) * OW * C, act, lo, hi, rows ? rows + r * C : 0);          \
        }                                                                               \
    }

struct aot_dw_args {
    const float *x, *w, *bias;
    float *y, *rows, *mean;
    long N, H, W, C, K, S, P, OH, OW, cw;
    long act;  /* 0: none, 1: SiLU, 2: clip to [lo, hi], 3: hardswish */
    float scale, lo, hi;
};

/* y[n, oh, ow, c] = act(bias[c] + sum_{kh,kw} x[n, oh*S-P+kh, ow*S-P+kw, c] w[kh, kw, c])
   (NHWC, C a multiple of 16, K in {3, 5}, S in {1, 2}; w is [K, K, C]). With mean:
   mean[n, c] = scale * sum_{oh,ow} y[n, oh, ow, c], each row's sums kept in
   rows[N * OH * C] first and added in row order (the same sums whatever the threads),
   written after every row is done (mean may be the buffer x was in). Returns 0. */
int aot_dw_run(const struct aot_dw_args *a) {
    const float *x = a->x, *w = a->w, *bias = a->bias;
    float *y = a->y, *rows = a->mean ? a->rows : 0, *mean = a->mean;
    long N = a->N, H = a->H, W = a->W, C = a->C, K = a->K, S = a->S, P = a->P;
    long OH = a->OH, OW = a->OW, cw = a->cw;
    int act = (int)a->act;
    float lo = a->lo, hi = a->hi;
    long nq = (C + cw - 1) / cw, items = N * OH * nq;
    long PW = ((OW + OB - 1) / OB * OB - 1) * S + K, PH = (OH - 1) * S + K;
    if (W <= IMG_W && PH * PW * CB <= IMG_FLOATS) {
        /* a small image: each 16 channels whole, from a padded copy on the stack */
        long nv = C / CB;
#pragma omp parallel
        {
            float buf[PH * PW * CB] __attribute__((aligned(64)));
            IMG_CASE(3, 1)
            else IMG_CASE(3, 2)
            else IMG_CASE(5, 1)
            else IMG_CASE(5, 2)
            if (mean) { /* once every image is read: mean may be where x was */
#pragma omp for schedule(static)
                for (long i = 0; i < N * C; ++i) mean[i] = rows[i];
            }
        }
        return 0;
    }
#pragma omp parallel
    {
        DW_CASE(3, 1)
        else DW_CASE(3, 2)
        else DW_CASE(5, 1)
        else DW_CASE(5, 2)
        if (mean) {
#pragma omp for schedule(static)
            for (long i = 0; i < N * C; ++i) {
                long n = i / C, c = i % C;
                float s = 0.f;
                for (long oh = 0; oh < OH; ++oh) s += rows[(n * OH + oh) * C + c];
                mean[i] = s * a->scale;
            }
        }
    }
    return 0;
}
"""


class _Args(C.Structure):
    _fields_ = [(name, C.c_void_p) for name in ("x", "w", "bias", "y", "rows", "mean")] + [
        (name, C.c_long) for name in ("N", "H", "W", "C", "K", "S", "P", "OH", "OW", "cw",
                                      "act")] + [(name, C.c_float) for name in ("scale", "lo", "hi")]




def _lib():
    return _build(c_vectors.FLAGS)


@functools.cache
def _build(flags: tuple):
    return c_compiler.load_kernel(_SOURCE, flags, "the depthwise convolution kernel", "aot_dw_run")


def available() -> bool:
    """The kernel compiled in this process."""
    return _lib() is not None


def fits(weight_shape, stride, padding, dilation) -> bool:
    """A depthwise ``[C, 1, K, K]`` weight (K 3 or 5, C a multiple of 16) with a square
    stride of 1 or 2, padding K // 2 and no dilation."""
    c, one, kh, kw = weight_shape
    s = list(stride)
    return one == 1 and kh == kw and kh in (3, 5) and c % 16 == 0 and len(set(s)) == 1 \
        and s[0] in (1, 2) and list(padding) == [kh // 2] * 2 and list(dilation) == [1, 1]


class Conv:
    """One depthwise convolution of ``[n, h, w, C]`` NHWC images into ``[n, oh, ow, C]``
    with the bias and the activation ``act`` after it (a name of ``ACTS``: ``"clip"``
    takes ``(lo, hi)``, e.g. ``(0, inf)`` for a ReLU). ``pool_into(address)`` has each call
    also write the means over the image (``[n, C]`` floats) there; then the rows' sums
    need a work buffer of ``work()`` floats (``bind``: one may serve many, the caller runs
    one at a time). ``kernel`` and ``args`` (addresses) are the C call ``__call__`` makes,
    for a caller's own loop, once ``x`` and ``y`` are set there (``point``)."""

    def __init__(self, n: int, h: int, w: int, weight: torch.Tensor, bias, stride: int,
                 act: str | None = None, lo: float = 0.0, hi: float = 0.0):
        self._lib = _lib()
        if self._lib is None:
            raise ValueError("the depthwise kernel is not available in this process")
        k = weight.shape[-1]
        if not fits(weight.shape, [stride] * 2, [k // 2] * 2, [1, 1]):
            raise ValueError(f"a weight of shape {tuple(weight.shape)} with stride {stride} "
                             "is not a depthwise convolution this kernel takes")
        c = weight.shape[0]
        p = k // 2
        oh, ow = (h + 2 * p - k) // stride + 1, (w + 2 * p - k) // stride + 1
        self.shape = (n, c, oh, ow)
        self.w = weight.detach().float().reshape(c, k * k).t().contiguous()  # [K*K, C]
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.a = _Args(w=self.w.data_ptr(), N=n, H=h, W=w, C=c, K=k, S=stride, P=p, OH=oh,
                       OW=ow, cw=_CHANNELS, act=ACTS[act], lo=lo, hi=hi)
        if self.bias is not None:
            self.a.bias = self.bias.data_ptr()
        self.args = C.addressof(self.a)
        self.kernel = C.cast(self._lib.aot_dw_run, C.c_void_p).value

    def work(self) -> int:
        n, c, oh, _ = self.shape
        return n * oh * c

    def bind(self, rows: torch.Tensor) -> None:
        """A work buffer of at least ``work()`` floats for the rows' sums."""
        self._rows = rows
        self.a.rows = rows.data_ptr()

    def pool_into(self, address: int) -> None:
        """Each call writes the means over the image at ``address`` too."""
        n, c, oh, ow = self.shape
        self.a.mean, self.a.scale = address, 1.0 / (oh * ow)

    def point(self, x_ptr: int, y_ptr: int) -> None:
        """The image's and the result's addresses."""
        self.a.x, self.a.y = x_ptr, y_ptr

    def run(self) -> None:
        """The call, on the ``x`` and ``y`` addresses set last."""
        self._lib.aot_dw_run(self.args)

    def __call__(self, x_ptr: int, y_ptr: int) -> None:
        self.point(x_ptr, y_ptr)
        self.run()
