#!/usr/bin/env python3
"""Write a corpus of hostile options and mountpoints and what each must produce.

    python3 tools/corpus/make_bad_options.py OUTDIR
writes valid bases (OUTDIR/good.gguf, a small GGUF MoE; OUTDIR/base_v4, a DeepSeek V4
checkpoint), the files some options name (FIFOs, devices, directories under OUTDIR/special/)
and OUTDIR/cases.json in the format of tools/corpus/corpus_util.py. Option cases are `-o` items
or flags (`args`); mountpoint cases name the kind of mountpoint the harness makes
(`mountpoint`: file, fifo, missing, symlink, fd).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_util import Corpus, mkfifo  # noqa: E402
from make_bad_gguf import F32T, experts, gguf  # noqa: E402
from make_bad_safetensors import v4_checkpoint  # noqa: E402


def main() -> int:
    c = Corpus(Path(sys.argv[1]), "options")
    out = c.out.resolve()
    c.path("good.gguf").write_bytes(gguf(experts(h=128, ff=64) + [("output_norm.weight", [128], F32T)]))
    v4_checkpoint(out / "base_v4")
    EP = ["auto", "expert-pack"]

    def opt(name, options, rule, views=None, args=(), source="good.gguf", materialize=True, note=""):
        expect = {"mount": rule}
        if materialize:
            expect["materialize"] = rule
        c.add(name, source, expect, options=options, args=args, views=views, note=note)

    # -- pack options (expert-pack view) --
    opt("alignment_2_40", ["alignment=1099511627776"], "'--alignment <ALIGNMENT>': 1099511627776 must be an integer from 1 to 1073741824, a power of two", EP)
    opt("alignment_2_63", ["alignment=9223372036854775808"], "'--alignment <ALIGNMENT>': 9223372036854775808 must be an integer from 1 to 1073741824, a power of two", EP)
    opt("alignment_2_32", ["alignment=4294967296"], "'--alignment <ALIGNMENT>': 4294967296 must be an integer from 1 to 1073741824, a power of two", EP)
    opt("alignment_3000", ["alignment=3000"], "'--alignment <ALIGNMENT>': 3000 is not a power of two (from 1 to 1073741824)", EP)
    opt("alignment_1", ["alignment=1"], "ok", EP)
    opt("top_k_negative", ["top_k=-1"], "'--top-k <TOP_K>': -1 must be an integer from 1 to 65536", EP)
    opt("top_k_flag_negative", [], "'--top-k <TOP_K>': -1 must be an integer from 1 to 65536", EP, args=["--top-k", "-1"])
    opt("top_k_u32_overflow", ["top_k=4294967296"], "'--top-k <TOP_K>': 4294967296 must be an integer from 1 to 65536", EP)
    opt("num_layers_flag_negative", [], "'--num-layers <NUM_LAYERS>': -5 must be an integer from 1 to 65536", EP, args=["--num-layers", "-5"])
    opt("name_slash", ["name=a/b"], "'--name <NAME>': \"a/b\" is not a plain file name (no '/', at most 200 bytes)", EP)
    opt("name_dotdot", ["name=.."], "'--name <NAME>': \"..\" is not a plain file name (no '/', at most 200 bytes)", EP)
    opt("name_long", ["name=" + "n" * 300], "is not a plain file name (no '/', at most 200 bytes)", EP)
    opt("model_identity_bad", ["model_identity_sha256=zz"], "'--model-identity-sha256 <MODEL_IDENTITY_SHA256>': \"zz\" is not a sha256 (64 hex digits)", EP)
    opt("config_sha_bad", ["config_sha256=" + "g" * 64], "is not a sha256", EP)
    mkfifo(out / "special/config.fifo")
    opt("config_blob_fifo", [f"config_blob={out}/special/config.fifo"], "option config_blob: " + str(out) + "/special/config.fifo: is a FIFO, not a regular file", EP)
    opt("config_blob_dev_zero", ["config_blob=/dev/zero"], "option config_blob: /dev/zero: is a character device, not a regular file", EP)
    (out / "special/config_dir").mkdir(parents=True, exist_ok=True)
    opt("config_blob_directory", [f"config_blob={out}/special/config_dir"], "option config_blob", EP)
    opt("config_blob_missing", [f"config_blob={out}/special/none.json"], "No such file or directory", EP)
    opt("config_blob_mismatch", [f"config_blob={out}/good.gguf", "config_sha256=" + "ab" * 32], "the config blob hashes to", EP)
    # -- view and cache options --
    opt("view_unknown", ["view=pack"], "'--view <VIEW>': unknown view \"pack\": auto, int8-tree, expert-pack, kimi-pack, bf16-cache, requant, kt-int8", None)
    opt("unknown_option", ["bogus=1"], "unknown option \"bogus\"", None)
    opt("option_without_value", ["top_k"], "option top_k needs a value", None)
    opt("flag_with_value", ["allow_other=yes"], "option allow_other takes no value", None)
    opt("cache_mb_zero", ["cache_mb=0"], "'--cache-mb <MIB>': 0 must be an integer from 1 to 16777216", None)
    opt("cache_mb_2_50", ["cache_mb=1125899906842624"], "'--cache-mb <MIB>': 1125899906842624 must be an integer from 1 to 16777216", None)
    opt("cache_mb_2_44", ["cache_mb=17592186044416"], "'--cache-mb <MIB>': 17592186044416 must be an integer from 1 to 16777216", None)
    opt("numa_count_zero", ["numa_count=0"], "'--numa-count <NUMA_COUNT>': 0 must be an integer from 1 to 64", None)
    opt("numa_count_huge", ["numa_count=1099511627776"], "'--numa-count <NUMA_COUNT>': 1099511627776 must be an integer from 1 to 64", ["kt-int8"])
    opt("numa_count_3", ["numa_count=3"], "option numa_count: 3 does not divide the intermediate size 64", ["kt-int8"])
    opt("w1_unknown", ["w1=Q4_0"], "'--w1 <W1>': \"Q4_0\" is not a type the requant view writes: IQ2_XXS, Q2_K or Q8_0", None)
    opt("stats_bad", ["stats=maybe"], "'--stats <STATS>': \"maybe\" is not on or off", None)
    # -- serving options (mount only) --
    opt("threads_zero", ["threads=0"], "'--threads <THREADS>': 0 must be an integer from 1 to 256", None, materialize=False)
    opt("threads_1000", ["threads=1000"], "'--threads <THREADS>': 1000 must be an integer from 1 to 256", None, materialize=False)
    opt("max_read_small", ["max_read=1"], "'--max-read <MAX_READ>': 1 must be an integer from 4096 to 1048576", None, materialize=False)
    opt("max_background_zero", ["max_background=0"], "'--max-background <MAX_BACKGROUND>': 0 must be an integer from 1 to 65535", None, materialize=False)
    opt("max_background_huge", ["max_background=70000"], "'--max-background <MAX_BACKGROUND>': 70000 must be an integer from 1 to 65535", None, materialize=False)
    opt("read_ahead_huge", ["read_ahead_kb=99999999999"], "'--read-ahead-kb <READ_AHEAD_KB>': 99999999999 must be an integer from 0 to 1048576", None, materialize=False)
    opt("direct_io_bad", ["direct_io=sometimes"], "'--direct-io <DIRECT_IO>': \"sometimes\" is not auto, on or off", None, materialize=False)
    opt("passthrough_bad", ["passthrough=x"], "'--passthrough <PASSTHROUGH>': \"x\" is not auto or off", None, materialize=False)
    opt("clone_fd_bad", ["clone_fd=2"], "'--clone-fd <CLONE_FD>': \"2\" is not on or off", None, materialize=False)
    c.path("special/plain_file").write_text("not a directory\n")
    opt("digest_store_file", [f"digest_store={out}/special/plain_file"], "", None, materialize=False, note="no rule expected: the store is a cache")
    c.cases[-1]["expect"] = {}
    # -- mountpoints --
    def mnt(name, kind, rule, note=""):
        c.add(name, "good.gguf", {"mount": rule}, mountpoint=kind, views=EP, note=note)

    mnt("mountpoint_regular_file", "file", "not a directory")
    mnt("mountpoint_fifo", "fifo", "not a directory")
    mnt("mountpoint_missing", "missing", "No such file or directory")
    mnt("mountpoint_symlink_to_dir", "symlink", "ok", note="a symlink to a directory mounts on the directory")
    mnt("mountpoint_bad_fd", "fd", "mountpoint /dev/fd/987: not an open /dev/fuse descriptor")
    mnt("mountpoint_is_source", "source", "not a directory")
    c.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
