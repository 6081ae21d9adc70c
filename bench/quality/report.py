#!/usr/bin/env python3
"""quality.json (evaluate.py) → a Markdown report and the trade-off plot.

  report.py QUALITY_JSON OUT_MD [OUT_PNG]
  report.py --summary OUT_MD QUALITY_JSON...   (appends every run's operating points)

The table is printed last on stdout too. Goals (MapFlow issue 8): at ≥ 50 % of the target's
attention FLOPs skipped, Δppl ≤ +1 % and top-1 agreement ≥ 97 % (both test splits); the
largest share of heads in prob mode with Δppl ≤ +2 %; the controls clearly worse.
"""
import json
import os
import sys


def fmt(x, f="%.2f"):
    return "–" if x is None or (isinstance(x, float) and x != x) else f % x


def worst(v, key, fn=max):
    return fn(v["in"][key], v["out"][key])


def table(res):
    sp = res["splits"]
    names = [v["name"] for v in res["variants"]]
    groups = {v["name"]: v["group"] for v in res["variants"]}
    spec = {v["name"]: v for v in res["variants"]}
    lines = ["| variant | group | prob heads | FLOPs skipped | density | row B/tok/layer | "
             "Δppl in | agree in | KL in | Δppl out | agree out | KL out | rel-L1 per layer (in) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        a, b = sp["in"]["variants"][n], sp["out"]["variants"][n]
        l1 = " ".join(fmt(x, "%.3f") for x in a["layer_rel_l1"] if x is not None) or "–"
        lines.append("| %s | %s | %s | %s | %s | %s | %s%% | %s%% | %s | %s%% | %s%% | %s | %s |" % (
            n, groups[n], fmt(100 * a["prob_head_share"], "%.0f%%"),
            fmt(a.get("skipped_pct"), "%.1f%%"), fmt(a.get("density"), "%.3f"),
            "–" if spec[n].get("emu") else fmt(a["row_bytes_per_token_layer"], "%.0f"),
            fmt(a.get("dppl_pct"), "%+.2f"), fmt(a.get("agree_pct"), "%.1f"),
            fmt(a.get("kl"), "%.4f"), fmt(b.get("dppl_pct"), "%+.2f"),
            fmt(b.get("agree_pct"), "%.1f"), fmt(b.get("kl"), "%.4f"), l1))
    return "\n".join(lines)


def merged(res):
    """Variants with numbers on both test splits (a deadline can leave a split without
    windows: those variants are reported as missing, not as zeros)."""
    sp = res["splits"]
    return {v["name"]: {"in": sp["in"]["variants"][v["name"]],
                        "out": sp["out"]["variants"][v["name"]], "spec": v}
            for v in res["variants"]
            if all(sp[s]["variants"].get(v["name"], {}).get("dppl_pct") is not None
                   for s in ("in", "out"))}


def goals(res):
    m = {n: v for n, v in merged(res).items() if not v["spec"].get("emu")}
    out = []
    ok = [(n, v) for n, v in m.items() if v["spec"]["kind"] in ("fit", "calib") and
          v["in"].get("skipped_pct", 0) >= 50 and worst(v, "dppl_pct") <= 1.0 and
          worst(v, "agree_pct", min) >= 97.0]
    if ok:
        n, v = max(ok, key=lambda x: x[1]["in"]["skipped_pct"])
        out.append("- Goal 1 (≥ 50 %% FLOPs skipped, Δppl ≤ +1 %%, agreement ≥ 97 %%): **met** by "
                   "`%s`: %.1f %% skipped, Δppl %+.2f %% / %+.2f %%, agreement %.1f %% / %.1f %% "
                   "(in / out)." % (n, v["in"]["skipped_pct"], v["in"]["dppl_pct"],
                                    v["out"]["dppl_pct"], v["in"]["agree_pct"],
                                    v["out"]["agree_pct"]))
    else:
        q = [(n, v) for n, v in m.items() if v["spec"]["kind"] in ("fit", "calib") and
             worst(v, "dppl_pct") <= 1.0 and worst(v, "agree_pct", min) >= 97.0 and
             v["in"].get("skipped_pct") is not None]
        best = max(q, key=lambda x: x[1]["in"]["skipped_pct"]) if q else None
        out.append("- Goal 1 (≥ 50 %% FLOPs skipped, Δppl ≤ +1 %%, agreement ≥ 97 %%): **missed**%s"
                   % ((": the most skipped within the quality bounds is `%s`, %.1f %%" %
                       (best[0], best[1]["in"]["skipped_pct"])) if best else ""))
        own = [(n, v) for n, v in m.items() if v["spec"]["kind"] == "own" and
               worst(v, "dppl_pct") <= 1.0 and worst(v, "agree_pct", min) >= 97.0]
        if own:
            n, v = max(own, key=lambda x: x[1]["in"]["skipped_pct"])
            out.append("  The target's own exact Top-P masses at one global Top-P reach "
                       "%.1f %% within the same bounds (`%s`)." % (v["in"]["skipped_pct"], n))
    q = [(n, v) for n, v in m.items() if v["spec"]["kind"] in ("fit", "calib") and
         worst(v, "dppl_pct") <= 2.0]
    if q:
        n, v = max(q, key=lambda x: (x[1]["in"]["prob_head_share"],
                                     x[1]["in"].get("skipped_pct") or 0))
        out.append("- Goal 2 (most heads in prob mode with Δppl ≤ +2 %%): `%s`, %.0f %% of all "
                   "target heads in prob mode (Δppl %+.2f %% / %+.2f %%)." % (
                       n, 100 * v["in"]["prob_head_share"], v["in"]["dppl_pct"],
                       v["out"]["dppl_pct"]))
    emu = {n: v for n, v in merged(res).items() if v["spec"].get("emu")}
    for b in sorted({v["spec"]["block"] for v in emu.values()}):
        inb = [(n, v) for n, v in emu.items() if v["spec"]["block"] == b and
               worst(v, "dppl_pct") <= 1.0 and worst(v, "agree_pct", min) >= 97.0]
        for kinds, what in ((("fit", "calib"), "mapped"), (("own",), "own Top-P bound")):
            q = [(n, v) for n, v in inb if v["spec"]["kind"] in kinds]
            if q:
                n, v = max(q, key=lambda x: x[1]["in"]["skipped_pct"])
                out.append("- B = %d (emulated), %s: the most skipped within the quality "
                           "bounds is `%s`, %.1f %% (Δppl %+.2f %% / %+.2f %%, agreement "
                           "%.1f %% / %.1f %%)." % (
                               b, what, n, v["in"]["skipped_pct"], v["in"]["dppl_pct"],
                               v["out"]["dppl_pct"], v["in"]["agree_pct"],
                               v["out"]["agree_pct"]))
            else:
                out.append("- B = %d (emulated), %s: no variant within the quality bounds."
                           % (b, what))
    for c in res.get("emu_checks", []):
        if "error" in c:
            out.append("- Emulation check (`%s`): failed: %s" % (c["variant"], c["error"]))
        else:
            out.append("- Emulation vs the C reference kernels (B = %d, %d tokens, target "
                       "layer %d from source layer %d): %d of %d kept row blocks differ, "
                       "mass max diff %.2g, attended blocks %d vs %d (mf_apply_ref), output "
                       "rel-L1 %.2g." % (c["block"], c["tokens"], c["target_layer"],
                                         c["source_layer"], c["kept_blocks_differ"],
                                         c["kept_blocks_ref"], c["mass_max_diff"],
                                         c["mask_blocks_emu"], c["mask_blocks_ref"],
                                         c["out_rel_l1"]))
    ctl = [(n, v) for n, v in m.items() if v["spec"]["kind"] in ("random", "uniform")]
    if ctl:
        out.append("- Controls: " + "; ".join(
            "`%s` Δppl %+.1f %% / %+.1f %%, agreement %.1f %% / %.1f %%" % (
                n, v["in"]["dppl_pct"], v["out"]["dppl_pct"], v["in"]["agree_pct"],
                v["out"]["agree_pct"]) for n, v in ctl) + ".")
    return "\n".join(out)


def ci_cell(r, key, f):
    """'value [lo, hi]' of one number with its window-bootstrap 95 % interval."""
    if r is None or r.get(key) is None:
        return "–"
    ci = (r.get("ci") or {}).get(key)
    return (f % r[key]) + (" [%s, %s]" % (f % ci[0], f % ci[1]) if ci else "")


def methods_section(res):
    """The verdict, the dev-chosen operating point of every method (issue 21) and prob
    mode per layer; '' for results without them."""
    ops = res.get("operating_points")
    if not ops:
        return ""
    v = res.get("verdict", {})
    c = res["config"]
    if v.get("met") is None:
        top = "**Not decided:** %s." % v.get("why", "no operating points")
    else:
        mf, b = ops["mapflow-mask"], ops[v["best_target_side"]]
        top = ("**MapFlow mask %s the target-side estimators**: at Δppl ≤ +1 %% and "
               "agreement ≥ 97 %% (thresholds chosen on the dev split) its effective density "
               "is %.3f against %.3f for the best target-side estimator (%s): %.2f× (goal "
               "≤ 0.8×: %s)." % ("beats" if v["met"] else "does not beat",
                                 mf["effective_density"], b["effective_density"],
                                 v["best_target_side"], v["ratio"],
                                 "met" if v["met"] else "missed"))
    lines = [top, "",
             "Operating points (ctx %d, B %d; chosen on %d dev windows of the calibration "
             "split, never on the test splits; [95 %% window-bootstrap interval]; effective "
             "density = 1 − FLOPs skipped, over all target attention, the worse split; "
             "density = attended share of the mapped heads' causal blocks):" % (
                 c["ctx"], c["block"], c.get("dev_windows", 0)), "",
             "| method | knob = dev choice | eff. density | density | FLOPs skipped in | "
             "FLOPs skipped out | Δppl in | Δppl out | agree in | agree out | KL in | KL out | "
             "bounds (point / CI) |", "|" + "---|" * 13]
    for m, r in ops.items():
        if not r.get("variant"):
            lines.append("| %s | %s: none of %s within the bounds on dev |%s" % (
                m, r["knob"], r["swept"], " – |" * 11))
            continue
        if r.get("effective_density") is None:  # the deadline left a test split empty
            lines.append("| %s | %s = %g (`%s`): no test windows on %s |%s" % (
                m, r["knob"], r["value"], r["variant"], ", ".join(r["missing_splits"]),
                " – |" * 11))
            continue
        i, o = r["in"], r["out"]
        lines.append("| %s | %s = %g (`%s`) | %.3f | %s | %s | %s | %s | %s | %s | %s | %s | "
                     "%s | %s / %s |" % (
                         m, r["knob"], r["value"], r["variant"], r["effective_density"],
                         fmt(r.get("density"), "%.3f"), ci_cell(i, "skipped_pct", "%.1f"),
                         ci_cell(o, "skipped_pct", "%.1f"), ci_cell(i, "dppl_pct", "%+.2f"),
                         ci_cell(o, "dppl_pct", "%+.2f"), ci_cell(i, "agree_pct", "%.1f"),
                         ci_cell(o, "agree_pct", "%.1f"), ci_cell(i, "kl", "%.4f"),
                         ci_cell(o, "kl", "%.4f"), "yes" if r["passes_test"] else "no",
                         "yes" if r["passes_test_ci"] else "no"))
    mf = ops.get("mapflow-mask", {})
    if mf.get("effective_density") is not None:
        x0 = 100.0 * (1.0 - mf["effective_density"])
        cells = []
        for m in ops:
            y = matched(res, m, x0)
            if y:
                cells.append("%s Δppl %+.2f %%, agreement %.1f %%" % (m, y[0], y[1]))
        lines += ["", "- At MapFlow mask's operating point (%.1f %% of FLOPs skipped), each "
                  "sweep interpolated linearly (the worse test split; sweeps not spanning "
                  "it left out): %s." % (x0, "; ".join(cells) or "–")]
    g = [m for m, r in ops.items() if r.get("goal_50pct")]
    lines += ["", "- Goal (≥ 50 %% of the target's attention FLOPs skipped within the bounds, "
              "intervals included, both test splits): %s." % (
                  "met by " + ", ".join(g) if g else "missed by every method")]
    pm = res.get("prob_mode", {})
    if pm.get("variant"):
        lines.append("- Prob mode at Δppl ≤ +2 %% (dev-chosen: `%s`): share of heads in prob "
                     "mode per target layer %s; test Δppl %s / %s." % (
                         pm["variant"], " ".join("%.0f%%" % (100 * x) for x in
                                                 pm["per_layer"]),
                         ci_cell(pm["in"], "dppl_pct", "%+.2f"),
                         ci_cell(pm["out"], "dppl_pct", "%+.2f")))
    else:
        lines.append("- Prob mode: no calibrated profile within Δppl ≤ +2 % on dev.")
    return "\n".join(lines) + "\n\n" + prob_section(res)


def layers_cell(per_layer):
    return " ".join("%.0f" % (100 * x) for x in per_layer)


def prob_section(res):
    """The prob-mode study (issue 21, goal 3): per calibration objective and prob gate the
    share of heads in prob mode per target layer and the numbers, the dev-chosen profile
    of each objective (most prob heads with dev Δppl ≤ +2 %) marked; '' without it."""
    pm = res.get("prob_mode", {})
    if not pm.get("study"):
        return ""
    chosen = {r.get("variant") for r in pm.get("by_objective", {}).values()}
    lines = ["### Prob mode by calibration objective (maps: W fitted to the attention maps, "
             "gated by the map's error; outputs: fitted to the head outputs A·V with the "
             "target's own V, gated by the centred output error; other heads mask, per-head "
             "Top-P, R 0.97)", "",
             "| objective | prob gate | variant | prob heads % per target layer | all | "
             "Δppl dev | Δppl in | Δppl out | KL in | KL out | agree in | agree out | "
             "dev-chosen |", "|" + "---|" * 13]
    for r in pm["study"]:
        d, i, o = r["dev"], r["in"], r["out"]
        lines.append("| %s | %g | `%s` | %s | %.0f %% | %s | %s | %s | %s | %s | %s | %s | %s |"
                     % (r["objective"], r["gate"], r["variant"], layers_cell(r["per_layer"]),
                        100 * r["share"], ci_cell(d, "dppl_pct", "%+.2f"),
                        ci_cell(i, "dppl_pct", "%+.2f"), ci_cell(o, "dppl_pct", "%+.2f"),
                        ci_cell(i, "kl", "%.4f"), ci_cell(o, "kl", "%.4f"),
                        ci_cell(i, "agree_pct", "%.1f"), ci_cell(o, "agree_pct", "%.1f"),
                        "**yes**" if r["variant"] in chosen else ""))
    for obj, r in pm.get("by_objective", {}).items():
        if r.get("variant"):
            lines.append("- %s objective, dev-chosen at Δppl ≤ +2 %%: gate %g, %.0f %% of the "
                         "heads in prob mode (per layer %s %%); test in / out: Δppl %s / %s, "
                         "KL %s / %s, agreement %s / %s." % (
                             obj, r["gate"], 100 * r["share"], layers_cell(r["per_layer"]),
                             ci_cell(r["in"], "dppl_pct", "%+.2f"),
                             ci_cell(r["out"], "dppl_pct", "%+.2f"),
                             ci_cell(r["in"], "kl", "%.4f"), ci_cell(r["out"], "kl", "%.4f"),
                             ci_cell(r["in"], "agree_pct", "%.1f"),
                             ci_cell(r["out"], "agree_pct", "%.1f")))
        else:
            lines.append("- %s objective: no profile of the study within Δppl ≤ +2 %% on dev."
                         % obj)
    return "\n".join(lines) + "\n\n"


def matched(res, method, x0):
    """(Δppl, agreement) of a method's sweep at x0 % FLOPs skipped, linear between the
    two nearest swept points (the worse test split); None outside the swept range."""
    pts = sorted((min(v["in"]["skipped_pct"], v["out"]["skipped_pct"]),
                  worst(v, "dppl_pct"), worst(v, "agree_pct", min))
                 for v in merged(res).values() if v["spec"].get("method") == method and
                 v["in"].get("skipped_pct") is not None)
    for a, b in zip(pts, pts[1:]):
        if a[0] <= x0 <= b[0]:
            f = 0.0 if b[0] == a[0] else (x0 - a[0]) / (b[0] - a[0])
            return a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])
    return None


def plot_methods(res, path):
    """Every method's sweep: FLOPs skipped against Δppl, KL and agreement (the worse test
    split, with its interval), the dev-chosen operating point starred."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    m = merged(res)
    ops = res["operating_points"]
    fig, ax = plt.subplots(1, 3, figsize=(18, 5.5))
    colors = plt.get_cmap("tab10").colors
    keys = (("dppl_pct", max, "Δ perplexity (%, the worse test split)"),
            ("kl", max, "KL(target ‖ variant) per token, the worse split"),
            ("agree_pct", min, "top-1 agreement (%, the worse split)"))
    for mi, method in enumerate(ops):
        vs = sorted((v for v in m.values() if v["spec"].get("method") == method and
                     v["in"].get("skipped_pct") is not None and
                     v["out"].get("skipped_pct") is not None),
                    key=lambda v: v["in"]["skipped_pct"])
        if not vs:
            continue
        x = [min(v["in"]["skipped_pct"], v["out"]["skipped_pct"]) for v in vs]
        for a, (k, fn, lab) in zip(ax, keys):
            y, lo, hi = [], [], []
            for v in vs:
                s = "in" if fn(v["in"][k], v["out"][k]) == v["in"][k] else "out"
                y.append(v[s][k])
                ci = (v[s].get("ci") or {}).get(k, [v[s][k], v[s][k]])
                lo.append(v[s][k] - ci[0])
                hi.append(ci[1] - v[s][k])
            a.errorbar(x, y, yerr=[lo, hi], color=colors[mi % 10], marker="o", ms=4,
                       capsize=2, label=method)
            op = ops[method].get("variant")
            if op in m and ops[method].get("effective_density") is not None:
                v = m[op]
                s = "in" if fn(v["in"][k], v["out"][k]) == v["in"][k] else "out"
                a.plot([min(v["in"]["skipped_pct"], v["out"]["skipped_pct"])], [v[s][k]],
                       marker="*", ms=14, color=colors[mi % 10], ls="none")
            a.set_xlabel("target attention FLOPs skipped (%, the worse split)")
            a.set_ylabel(lab)
    ax[0].axhline(1.0, color="k", ls=":", lw=1)
    ax[2].axhline(97.0, color="k", ls=":", lw=1)
    # outside the quality bounds, shaded (limits fixed first so the shading does not move them)
    for a, lo_hi in ((ax[0], lambda y: (1.0, max(y[1], 1.0))),
                     (ax[2], lambda y: (min(y[0], 97.0), 97.0))):
        y = a.get_ylim()
        a.set_ylim(*y)
        a.axhspan(*lo_hi(y), color="tab:red", alpha=0.07, lw=0)
    for a in ax:
        a.axvline(50, color="k", ls=":", lw=1)
    ax[0].legend(fontsize=8)
    c = res["config"]
    fig.suptitle("MapFlow mask vs target-side estimators (ctx %d, B %d; ★ = dev-chosen "
                 "operating point)" % (c["ctx"], c["block"]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    m = merged(res)
    groups = {}
    for n, v in m.items():
        if v["in"].get("skipped_pct") is None or v["spec"]["kind"] == "uniform":
            continue
        groups.setdefault(v["spec"]["group"], []).append(v)
    fig, ax = plt.subplots(1, 2, figsize=(14, 5.5))
    colors = plt.get_cmap("tab20").colors
    for gi, (g, vs) in enumerate(sorted(groups.items())):
        # sweeps (one knob varied) are lines; groups of unrelated variants are points
        sweep = vs[0]["spec"]["policy"] in ("mask", "own") and \
            vs[0]["spec"]["kind"] in ("fit", "own")
        vs = sorted(vs, key=lambda v: v["in"]["skipped_pct"])
        x = [v["in"]["skipped_pct"] for v in vs]
        kw = dict(color=colors[gi % len(colors)], marker="os^vDP*Xhp<>"[gi % 12],
                  ls="-" if sweep else "none", label=g)
        ax[0].plot(x, [max(1e-3, worst(v, "dppl_pct")) for v in vs], **kw)
        ax[1].plot(x, [worst(v, "agree_pct", min) for v in vs], **kw)
    ax[0].set_yscale("log")
    ax[0].axhline(1.0, color="k", ls=":", lw=1)
    ax[0].axvline(50, color="k", ls=":", lw=1)
    ax[0].set_xlabel("target attention FLOPs skipped (%)")
    ax[0].set_ylabel("Δ perplexity, the worse test split (%, log; ≤ 0 at 0.001)")
    ax[1].axhline(97, color="k", ls=":", lw=1)
    ax[1].axvline(50, color="k", ls=":", lw=1)
    ax[1].set_xlabel("target attention FLOPs skipped (%)")
    ax[1].set_ylabel("top-1 agreement with the target, the worse split (%)")
    ax[1].set_ylim(max(50.0, ax[1].get_ylim()[0]), 100.5)
    ax[1].legend(fontsize=7)
    fig.suptitle("MapFlow reuse, source 6L×8H → target 4L×6H: trade-off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(paths):
    """The operating points of several runs (seeds, block sizes) side by side."""
    lines = ["## Every run: effective density at the dev-chosen operating point (✓: within "
             "the bounds on both test splits, intervals included)", "",
             "| run | seed (source, target) | ctx | B | verdict (ratio) | " +
             " | ".join(METHODS) + " |", "|" + "---|" * (5 + len(METHODS))]
    groups, loaded = {}, []
    for n, p in enumerate(paths):
        with open(p) as f:
            res = json.load(f)
        loaded.append(res)
        c, ops, v = res["config"], res.get("operating_points", {}), res.get("verdict", {})
        groups.setdefault((c["ctx"], c["block"]), []).append((ops, v))
        tr = res.get("train", {})
        seeds = "%s, %s" % (tr.get("source", {}).get("seed", "–"),
                            tr.get("target", {}).get("seed", "–"))
        cells = []
        for m in METHODS:
            r = ops.get(m, {})
            cells.append("%.3f%s" % (r["effective_density"], " ✓" if r["passes_test_ci"]
                                     else "") if r.get("effective_density") is not None
                         else "none" if m in ops else "–")  # –: not run (--sweeps)
        verdict = "–" if v.get("met") is None else "%s (%.2f×)" % (
            "met" if v["met"] else "missed", v["ratio"])
        lines.append("| %s | %s | %d | %d | %s | %s |" % (
            "first" if n == 0 else os.path.basename(os.path.dirname(p)), seeds, c["ctx"],
            c["block"], verdict, " | ".join(cells)))
    # across seeds: the range of each method's effective density, and the verdicts
    lines += ["", "Across seeds (min – max effective density; runs within the bounds):", ""]
    for (ctx, b), runs in sorted(groups.items()):
        cells = []
        for m in METHODS:
            if not any(m in o for o, _ in runs):  # not run (--sweeps)
                continue
            d = [o[m]["effective_density"] for o, _ in runs
                 if o.get(m, {}).get("effective_density") is not None]
            ok = sum(1 for o, _ in runs if o.get(m, {}).get("passes_test_ci"))
            cells.append("%s: %s (%d/%d)" % (m, "%.3f – %.3f" % (min(d), max(d)) if d
                                             else "none", ok, len(runs)))
        met = sum(1 for _, v in runs if v.get("met"))
        lines.append("- ctx %d, B %d, %d seed(s): verdict met in %d; %s." % (
            ctx, b, len(runs), met, "; ".join(cells)))
    lines += ["", "Prob mode per run (the dev-chosen profile of each objective at Δppl ≤ +2 %: "
              "prob gate, share of heads in prob mode, per target layer in %, test Δppl in / "
              "out):", "", "| run | B | objective | gate | prob heads | per layer % | "
              "Δppl in | Δppl out |", "|" + "---|" * 8]
    for n, (p, res) in enumerate(zip(paths, loaded)):
        for obj, r in res.get("prob_mode", {}).get("by_objective", {}).items():
            run = "first" if n == 0 else os.path.basename(os.path.dirname(p))
            if not r.get("variant"):
                lines.append("| %s | %d | %s | none within +2 %% on dev | – | – | – | – |" % (
                    run, res["config"]["block"], obj))
                continue
            lines.append("| %s | %d | %s | %g | %.0f %% | %s | %s | %s |" % (
                run, res["config"]["block"], obj, r["gate"], 100 * r["share"],
                layers_cell(r["per_layer"]), ci_cell(r["in"], "dppl_pct", "%+.2f"),
                ci_cell(r["out"], "dppl_pct", "%+.2f")))
    return "\n".join(lines) + "\n"


METHODS = ("mapflow-mask", "oracle", "xattention", "flexprefill", "pooled-qk",
           "random-w-calibrated")


def main():
    if sys.argv[1] == "--summary":  # report.py --summary OUT_MD QUALITY_JSON...
        text = summary(sys.argv[3:])
        with open(sys.argv[2], "a") as f:
            f.write("\n" + text)
        print(text)
        return
    with open(sys.argv[1]) as f:
        res = json.load(f)
    c, sp = res["config"], res["splits"]
    head = ["# Quality: reused maps vs the target alone", ""]
    tr = res.get("train", {})
    for name in ("source", "target"):
        if name in tr:
            t, cfg = tr[name], c[name]
            head.append("- %s: %d layers × %d heads × %d, %.1fM params, %d steps, %.0fM tokens%s, "
                        "%.0f s; own test ppl in %.2f, out %.2f%s" % (
                            name, cfg["n_layer"], cfg["n_head"], cfg["d_model"],
                            t["params"] / 1e6, t["steps"], t["tokens"] / 1e6,
                            " (%.1f epochs)" % t["epochs"] if "epochs" in t else "",
                            t["seconds"], t["ppl_in"], t["ppl_out"],
                            "; held-out loss at each quarter of the time: " + " ".join(
                                "%.3f" % x[2] for x in t["val_loss"]) if "val_loss" in t
                            else ""))
    for s in ("in", "out"):
        b = sp[s]["base"]
        head.append("- target alone (%s, %d windows × %d tokens): ppl %.3f through our apply "
                    "kernel's compute path, %.3f with PyTorch SDPA" % (
                        s, b["windows"], c["ctx"], b["ppl"], b["ppl_sdpa"]))
    head.append("- block %d, recompute last %d block(s), calibration %d × %d tokens, "
                "FLOPs/density from %d windows per split, backend %s" % (
                    c["block"], c["recompute_last"], c["cal_windows"], c["cal_n"],
                    c["acct_windows"], c["backend"]))
    xr = res.get("exporter_recall")
    if c.get("exporter", "extract") != "extract":
        head.append("- source rows from the %s exporter%s" % (
            c["exporter"], "" if not xr else
            " (stride %d, offset %d, the source's LSE): kept-set recall against the exact "
            "masses' %.4f, density ratio %.3f; per (layer, row Top-P): %s" % (
                xr["stride"], xr["offset"], xr["recall"], xr["density_ratio"],
                ", ".join("L%d@%.2g %.3f/%.2f" % (x["layer"], x["top_p"], x["recall"],
                                                    x["density_ratio"])
                          for x in xr["per_layer_top_p"]))))
    text = methods_section(res) + "\n".join(head) + "\n\n" + goals(res) + "\n\n" + \
        table(res) + "\n"
    with open(sys.argv[2], "w") as f:
        f.write(text + "\n## Calibration (mapflow-calibrate)\n\n```\n" +
                res.get("calibration_summary", "") + "```\n")
    if len(sys.argv) > 3:
        try:
            (plot_methods if res.get("operating_points") else plot)(res, sys.argv[3])
        except Exception as ex:  # noqa: BLE001  (the table matters more than the plot)
            print("report: no plot:", ex, file=sys.stderr)
    print(text)


if __name__ == "__main__":
    main()
