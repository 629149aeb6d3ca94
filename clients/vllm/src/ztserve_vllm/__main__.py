"""`python -m ztserve_vllm plan MODEL --tp 8 [--ep]`: what each rank of a vLLM engine would fetch
of a model on a ztserve server through `--load-format ztserve`, without loading a weight: its
bytes against its share of the model, what every rank reads whole, and what is fetched whole
though split and why. The plan is `config_plan`'s, from the model's `config.json` and manifest
(no vLLM needed), which cuts every tensor as the load format does for the model vLLM builds."""

import argparse
import json
import os
import sys

from ztserve_client import Client, NotFound, ZtserveError

from . import config_plan, settings, weights

# What the plan promises: a rank fetches at most this times its fair share of the model.
TARGET = 1.1


def rank_costs(manifest, config, tp, ep):
    """Each rank's `weights.costs` of the model, with `fair`: the bytes of its fair share (what
    the model loads, every byte of it once over the ranks, plus what every rank reads whole,
    `everywhere`)."""
    objects = {o["name"]: o for o in manifest["objects"]}
    tensors = {name: tuple(o["shape"]) for name, o in objects.items()}
    plans = [config_plan.plan(config, tensors, rank, tp, ep) for rank in range(tp)]
    unused, everywhere = set(tensors), set(tensors)
    for one in plans:
        unused &= {p.name for p in one if p.regions == []}
        everywhere &= {p.name for p in one if p.regions is None and not p.reason}
    loaded = sum(weights.object_bytes(o) for name, o in objects.items() if name not in unused)
    replicated = sum(weights.object_bytes(objects[name]) for name in everywhere)
    out = []
    for one in plans:
        cost = weights.costs(objects, one)
        cost["fair"] = (loaded - replicated) / tp + replicated
        cost["everywhere"] = [len(everywhere), replicated]
        out.append(cost)
    return out


def size(n):
    """Bytes for a reader: GB, MB or kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def report(model, version, costs, tp, ep):
    """The plan as text: a row per rank, then what is fetched whole and why."""
    total = costs[0]["total"]
    count, replicated = costs[0]["everywhere"]
    lines = [f"{model} version {version}: {size(total)}; TP={tp}" + (", expert parallel" if ep else ""), "",
             "| rank | fetches | x (model / TP) | x its fair share | cut | whole | not loaded | whole though split |",
             "|---|---|---|---|---|---|---|---|"]
    for rank, c in enumerate(costs):
        whole = sum(e["bytes"] for e in c["whole"].values())
        lines.append(f"| {rank} | {size(c['planned'])} | {c['planned'] / (total / tp):.2f}x | {c['planned'] / c['fair']:.3f}x | "
                     f"{c['cut']:,} | {c['replicated'][0]:,} ({size(c['replicated'][1])}) | {c['skipped']:,} | "
                     f"{sum(len(e['names']) for e in c['whole'].values()):,} ({size(whole)}) |")
    worst = max(c["planned"] / c["fair"] for c in costs)
    lines += ["", f"Read whole by every rank: {count:,} tensors, {size(replicated)} (norms, router gates, latent-attention "
                  f"down-projections...). A rank's fair share: what the model loads over {tp} ranks, plus those. "
                  f"Worst rank: {worst:.3f}x its fair share ({'within' if worst <= TARGET else 'over'} {TARGET}x)."]
    reasons = {}
    for c in costs:
        for (cls, reason), entry in c["whole"].items():
            seen = reasons.setdefault((cls, reason), [0, 0, entry["names"]])
            seen[0] += len(entry["names"])
            seen[1] += entry["bytes"]
    if reasons:
        lines += ["", "Fetched whole though split (all ranks):"]
        for (cls, reason), (n, total_bytes, names) in sorted(reasons.items()):
            lines.append(f"- {n:,} tensor(s) of {cls} ({size(total_bytes)}): {reason}; e.g. {weights.sample(names)}")
    else:
        lines += ["", "Nothing is fetched whole though split."]
    return "\n".join(lines)


def model_id(client, name, namespace):
    """A ztserve model id, or the first one Hub repository `name` may name that the server has."""
    ids = settings.repo_to_model_ids(name, namespace)
    for candidate in [name] + ids:
        try:
            return candidate, client.manifest(candidate)
        except NotFound:
            continue
    raise NotFound(404, "model_not_found", f"the server has no model {name!r} (tried {[name] + ids})", client.url)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ztserve_vllm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="what each rank would fetch of a model, without loading it")
    plan.add_argument("model", help="the model's ztserve id or Hub repository id on the server")
    plan.add_argument("--url", default=os.environ.get("ZTSERVE_URL"), help="the server (default ZTSERVE_URL)")
    plan.add_argument("--token", default=os.environ.get("ZTSERVE_TOKEN") or os.environ.get("HF_TOKEN"))
    plan.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    plan.add_argument("--ep", action="store_true", help="expert parallelism (vLLM's --enable-expert-parallel)")
    plan.add_argument("--hub-namespace", default=os.environ.get("ZTSERVE_HUB_NAMESPACE", settings.HUB_NAMESPACE))
    plan.add_argument("--json", action="store_true", help="each rank's costs as JSON")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("the server's URL is needed: --url http://HOST:PORT or ZTSERVE_URL")
    if args.tp < 1:
        parser.error("--tp must be at least 1")
    try:
        with Client(args.url, args.token) as client:
            model, manifest = model_id(client, args.model, args.hub_namespace)
            config = json.loads(client.file(model, "config.json"))
        costs = rank_costs(manifest, config, args.tp, args.ep)
    except KeyError as e:
        print(f"ztserve_vllm plan: {args.model}'s config.json has no {e}, which the plan needs", file=sys.stderr)
        return 1
    except (ZtserveError, ValueError) as e:
        print(f"ztserve_vllm plan: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    version = manifest.get("model_version", "?")
    if args.json:
        print(json.dumps({"model": model, "version": version, "tp": args.tp, "ep": args.ep, "ranks": [
            {"rank": rank, "planned": c["planned"], "share": c["share"], "fair": c["fair"], "total": c["total"], "cut": c["cut"],
             "skipped": c["skipped"], "whole_here": c["replicated"], "whole_everywhere": c["everywhere"],
             "whole": [{"class": cls, "reason": reason, "count": len(e["names"]), "bytes": e["bytes"]}
                       for (cls, reason), e in c["whole"].items()]}
            for rank, c in enumerate(costs)]}))
    else:
        print(report(model, version, costs, args.tp, args.ep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
