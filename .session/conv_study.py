"""How fast do two forward trajectories of the KLA op (float32) from different starts become
bitwise equal? Inputs captured from the LM step's model (random init) and the bundled model."""
import sys, torch, numpy as np
import kalmanscan.core.kla_op as ko
from kalmanscan.kla import KLALanguageModel, ModelConfig

captured = []
orig = ko.kla_filter
def spy(*args, **kw):
    captured.append([t.detach().float().clone() for t in args[:6]])
    return orig(*args, **kw)
ko.kla_filter = spy

which = sys.argv[1]; L = int(sys.argv[2]); Lc = int(sys.argv[3])
torch.manual_seed(0)
if which == "random":
    model = KLALanguageModel(ModelConfig(vocab_size=256, d_model=512, n_layers=6, mixers="kla"))
    tokens = torch.randint(0, 256, (1, L))
else:
    from kalmanscan.kla import io as kio
    model = kio.load_checkpoint("kalmanscan/kla/weights")
    model = model[0] if isinstance(model, tuple) else model
    import glob
    text = b"".join(open(f, "rb").read() for f in sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))[:400])
    tokens = torch.tensor(list(text[:L]), dtype=torch.long)[None]
for blk in model.blocks:
    blk.mixer.glue = "eager"
with torch.no_grad():
    model(tokens)

def walk(lam, eta, v, Lv, k, a, p):
    rden = 1.0 / (p * lam + a * a)
    lam = lam * rden + Lv[..., None] * (k[..., None, :] * k[..., None, :])
    eta = a * rden * eta + (v * Lv)[..., None] * k[..., None, :]
    return lam, eta

for li, (v, Lv, k, q, a, p) in enumerate(captured):
    v, Lv, k = v[0], Lv[0], k[0]  # [L, M], [L, S]
    M, S = a.shape
    C = L // Lc
    lam = torch.ones(M, S); eta = torch.zeros(M, S)
    starts = []
    # true walk; record chunk starts
    for t in range(L):
        if t % Lc == 0:
            starts.append((lam.clone(), eta.clone()))
        lam, eta = walk(lam, eta, v[t], Lv[t], k[t], a, p)
    # guess walks for chunks 1..C-1 at once, compare with true walk (re-run true in parallel)
    tl_ = torch.stack([s[0] for s in starts[1:]]); te = torch.stack([s[1] for s in starts[1:]])
    gl = torch.ones_like(tl_); ge = torch.zeros_like(te)
    conv = torch.full((C - 1, M, S), Lc + 1, dtype=torch.int32)
    vv = v.view(C, Lc, M)[1:]; LL = Lv.view(C, Lc, M)[1:]; kk = k.view(C, Lc, S)[1:]
    for t in range(Lc):
        tl_, te = walk(tl_, te, vv[:, t], LL[:, t], kk[:, t], a, p)
        gl, ge = walk(gl, ge, vv[:, t], LL[:, t], kk[:, t], a, p)
        eq = (tl_ == gl) & (te == ge)
        newly = eq & (conv > Lc)
        conv[newly] = t + 1
        conv[~eq] = Lc + 1  # not yet for good
    # programs: 8 channels x 16 slots
    prog = conv.view(C - 1, M // 8, 8 * S).amax(-1).float()
    ck8 = torch.ceil(prog / 8) * 8
    lane = conv.float()
    nc_l = (lane > Lc).float().mean().item(); nc_p = (prog > Lc).float().mean().item()
    fr = torch.clamp(ck8, max=Lc).mean().item() / Lc
    print(f"{which} L={L} Lc={Lc} layer {li}: lanes unconverged {nc_l:.3f}, programs unconverged {nc_p:.3f}; "
          f"lane conv steps median {lane[lane<=Lc].median().item() if (lane<=Lc).any() else -1:.0f} "
          f"p90 {lane.quantile(0.9).item():.0f}; program fix-up fraction of chunk {fr:.3f}; a min/med/max {a.min():.4f}/{a.median():.4f}/{a.max():.6f} p med {p.median():.2e}", flush=True)
