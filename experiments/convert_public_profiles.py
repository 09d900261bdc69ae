"""Convert the public Sailor data into the profiles and network table bundled with hpp.

Reads ``../shared/profiles/public/sailor`` (eth-easl/sailor commit cf2c8e3, MIT licence,
Copyright ETH Zurich) and writes ``hpp/profiles/data/``: ``profile-<MODEL>.json``,
``network.json`` and ``NOTICE``. The conversion rules live in :mod:`hpp.profiles.public`
and :mod:`hpp.profiles.network`; this script only picks the inputs and writes the outputs.

Usage: ``python experiments/convert_public_profiles.py [--sailor DIR] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Sequence

from hpp.profiles.model_profile import ModelProfile
from hpp.profiles.profile_format import save_profile
from hpp.profiles.network import NETWORK_DATA_FILE, NETWORK_ZONE, network_table_from_sailor
from hpp.profiles.public_common import SAILOR_ARTIFACT, SAILOR_LICENCE, sequence_length_from_llm_info
from hpp.profiles.public import load_sailor_profiles
from hpp.fileio import read_json
from hpp.profiles.bundled import bundled_profile_filename

logger = logging.getLogger("convert_public_profiles")
REPO = Path(__file__).resolve().parents[1]
#: model -> (training config in training-configs/ or None, hidden size used to derive the sequence length)
MODELS = {
    "OPT-350": ("training_config_opt_350.json", 1024),
    "GPT-Neo-2.7": ("training_config_gpt_neo27.json", 2560),
    # No training config in the artifact; hidden size 4096 is Llama-3-8B's published value.
    "LLAMA-3-8": (None, 4096),
}
#: What llm_info.json implies about the profiled architecture, where it differs from the model's name.
NOTES = {
    "LLAMA-3-8": {"architecture_note": (
        "llm_info.json implies hidden 4096, full multi-head attention (4 x 4096^2 floats), a gated MLP "
        "of width 16384 (3 x 4096 x 16384) and an embedding of 50304 x 4096 floats: a Llama-like 8B model, "
        "not Llama-3-8B's GQA / 14336 / 128256 vocabulary. 35 layers: embedding, 32 blocks, final norm (4096 floats), head (4096 floats: the output "
        "projection is not counted there, apparently tied to the embedding).")},
}
RULES = ("times: simulator-profiles.json [fwd_s, bwd_s, update_s] per layer (optimizer_s = update_s, "
         "Sailor's per-layer share of the optimizer step); bytes: llm_info.json at the entry's TP degree, "
         "param_bytes = params_bytes, activation_bytes = b * act_mem_bytes, output_bytes = b * act_output_bytes; "
         "TP degrees absent from llm_info.json are skipped (meta.skipped_entries); see hpp/profiles/public.py")


def convert_model(sailor: Path, model: str) -> ModelProfile:
    """Load one model from simulator-profiles.json + llm_info.json with provenance filled in."""
    config_name, hidden = MODELS[model]
    llm_info = sailor / "llm_info.json"
    seq = sequence_length_from_llm_info(llm_info, model, hidden_size=hidden)
    meta: dict = {"hidden_size": hidden}
    if config_name is not None:
        config = read_json(sailor / "training-configs" / config_name, what="training config")
        meta.update(config)
        meta["training_config"] = f"training-configs/{config_name}"
        if config["sequence_length"] != seq:
            raise ValueError(f"{model}: training config says seq {config['sequence_length']}, llm_info implies {seq}")
    else:
        meta["sequence_length_rule"] = (f"no training config in the artifact; sequence_length = llm_info "
                                        f"act_output_floats of layer 1 at TP 1 / hidden_size {hidden} = {seq}")
        meta.update(NOTES.get(model, {}))
    source = (f"{SAILOR_ARTIFACT}: simulator-profiles.json[{model}] and llm_info.json[{model}]; {RULES}")
    return load_sailor_profiles(model, sailor / "simulator-profiles.json", llm_info, sequence_length=seq,
                                source=source, licence=SAILOR_LICENCE, meta=meta)


def notice_text(sailor: Path, models: Sequence[str]) -> str:
    licence = (sailor / "LICENSE").read_text()
    derived = "\n".join(f"- {bundled_profile_filename(m)}: simulator-profiles.json[{m}] + llm_info.json[{m}]"
                        + (f" + training-configs/{MODELS[m][0]}" if MODELS[m][0] else "") for m in models)
    return (f"The data files in this directory are derived from the public artifact of Sailor\n"
            f"(SOSP'25), {SAILOR_ARTIFACT}, under the MIT licence below.\n\nDerived files:\n{derived}\n"
            f"- {NETWORK_DATA_FILE}: network/intra_node_bandwidths.json and "
            f"network/multizone_bandwidths_het.json (zone {NETWORK_ZONE} only)\n"
            f"- the device table in hpp/profiles/devices.py: cluster-basic.json\n"
            f"Conversion rules: hpp/profiles/public.py and hpp/profiles/network.py; generator:\n"
            f"experiments/convert_public_profiles.py.\n\n"
            f"Not derived from Sailor: profile-gpt-tiny.json was measured by hpp itself (`hpp profile\n"
            f"--model gpt-tiny --device cpu`); its machine, torch version, date and load are recorded in it.\n\n"
            f"--- Sailor LICENSE ---\n{licence}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convert_public_profiles")
    parser.add_argument("--sailor", type=Path, default=REPO.parent / "shared" / "profiles" / "public" / "sailor")
    parser.add_argument("--out", type=Path, default=REPO / "hpp" / "profiles" / "data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        path = args.out / bundled_profile_filename(model)
        save_profile(convert_model(args.sailor, model), path)
        logger.info("wrote %s (%d bytes)", path, path.stat().st_size)
    table = network_table_from_sailor(args.sailor / "network" / "intra_node_bandwidths.json",
                                      args.sailor / "network" / "multizone_bandwidths_het.json")
    network = {"format": "hpp-network-fits", "version": 1,
               "source": f"{SAILOR_ARTIFACT}: network/intra_node_bandwidths.json, "
                         f"network/multizone_bandwidths_het.json[{NETWORK_ZONE}][src][n][{NETWORK_ZONE}][dst][n]",
               "licence": SAILOR_LICENCE,
               "units": "fit [[a, b, c], max]: a*L^2 + b*L + c GB/s with L = log2(bytes / 1e6); max in bytes/s",
               **table}
    (args.out / NETWORK_DATA_FILE).write_text(json.dumps(network, separators=(",", ":")) + "\n")
    (args.out / "NOTICE").write_text(notice_text(args.sailor, list(MODELS)))
    logger.info("wrote %s and NOTICE", args.out / NETWORK_DATA_FILE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
