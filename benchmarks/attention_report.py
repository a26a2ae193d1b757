"""Merge `xpuruntime bench --only attention...` results into benchmarks/results/attention_h100.{json,md}.

Usage: python benchmarks/attention_report.py [--stem=NAME] OUT_DIR [OUT_DIR ...]  (each holding a results.json; rows of a
later folder replace rows of the same name from earlier ones)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "results"


def flops(name: str) -> float:
    m = re.search(r"B(\d+) H(\d+)(?:/\d+)? S(\d+) D(\d+)", name)
    b, h, s, d = map(int, m.groups())
    f = 4.0 * b * h * s * s * d * (0.5 if "causal" in name else 1.0)
    return f * (3.5 if "fwd+bwd" in name else 1.0)


def tflops(name: str, ms: float | None) -> str:
    return "-" if not ms else f"{flops(name) / ms / 1e9:.0f}"


def main(folders: list[str], stem: str = "attention_h100") -> None:
    by_name, env = {}, {}
    for folder in folders:  # a later folder's row replaces an earlier one of the same name (a re-run)
        data = json.loads((Path(folder) / "results.json").read_text())
        env = data.get("environment", env)
        for row in data["rows"]:
            row["source"] = Path(folder).name
            by_name[row["name"]] = row
    rows = list(by_name.values())
    HERE.mkdir(parents=True, exist_ok=True)
    (HERE / f"{stem}.json").write_text(json.dumps({"environment": env, "results": rows}, indent=1))
    lines = [
        "# Attention on the H100: flash_v2 beside PyTorch's SDPA backends (TFLOP/s)",
        "",
        "One process per table half (`xpuruntime bench --only 'attention fwd '` / `'attention fwd+bwd'`); "
        "median of `triton.testing.do_bench` (L2 flushed); FLOPs: forward 4*B*H*S*S*D (half when causal), "
        "forward+backward 3.5x. `ratio` = flash_v2 over PyTorch's flash backend (the anchor). Forward "
        "columns for the PyTorch backends, `auto` and `autotune` run through the `attention` op (policy-forced); "
        "forward+backward columns for PyTorch run SDPA + autograd directly. `auto/best`, `autotune/best`: "
        "the fastest column's time over that column's time.",
        "",
        "| row | flash_v2 | torch_flash | torch_cudnn | torch_efficient | ratio (target) | auto/best | autotune/best |"
        " status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        alt = r.get("alternatives_ms") or {}
        name = r["name"]
        best = min(alt.values()) if alt else None
        cells = [
            tflops(name, r.get("ours_ms")),
            tflops(name, alt.get("torch_flash") or alt.get("sdpa_flash") or r.get("anchor_ms")),
            tflops(name, alt.get("torch_cudnn") or alt.get("sdpa_cudnn")),
            tflops(name, alt.get("torch_efficient") or alt.get("sdpa_efficient")),
        ]
        ratio = r.get("ratio")
        target = r.get("target")
        ratio_text = "-" if ratio is None else f"{ratio:.2f}x" + (f" ({target}x)" if target else "")
        auto = f"{best / alt['auto']:.2f}" if best and alt.get("auto") else "-"
        tuned = f"{best / alt['autotune']:.2f}" if best and alt.get("autotune") else "-"
        status = r.get("status", "") + (" (re-run)" if r.get("source") == "rerun" else "")
        if r.get("met") is False:
            status += f", missed by {100 * (r.get('missed_by') or 0):.0f}%"
        if r.get("message") and r.get("status") != "ok":
            status += f": {r['message'][:120]}"
        lines.append(f"| {name.removeprefix('attention ')} | " + " | ".join(cells)
                     + f" | {ratio_text} | {auto} | {tuned} | {status} |")  # fmt: skip
    (HERE / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    args = sys.argv[1:]
    stems = [a.removeprefix("--stem=") for a in args if a.startswith("--stem=")]
    main([a for a in args if not a.startswith("--stem=")], *stems[:1])
