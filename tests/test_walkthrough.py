"""What a newcomer's walk through the README needs besides the run itself: a saved model keeps
the tokenizer it was loaded with, and every published figure can name its machine."""
import switchzoo
from switchzoo import hf, machine


def test_save_pretrained_writes_the_tokenizer_it_was_loaded_with(tmp_path):
    source = tmp_path / "switch-base-8"
    cfg = switchzoo.zoo.get("switch_base_tiny").replace(vocab_size=512)
    switchzoo.init(cfg).save_pretrained(source, expert_capacity=64)   # init: no tokenizer
    assert not set(hf.TOKENIZER_FILES) & {p.name for p in source.iterdir()}
    files = {"spiece.model": b"\x0a\x05piece", "tokenizer_config.json": b'{"extra_ids": 100}',
             "special_tokens_map.json": b'{"eos_token": "</s>"}'}
    for name, data in files.items():
        (source / name).write_bytes(data)
    (source / "notes.txt").write_text("not a tokenizer file")
    switchzoo.from_pretrained(source).save_pretrained(tmp_path / "copy")
    copied = {p.name: p.read_bytes() for p in (tmp_path / "copy").iterdir()}
    assert {k: copied.get(k) for k in files} == files and "notes.txt" not in copied
    assert {"config.json", hf.SINGLE} <= copied.keys()


X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
stepping\t: 1
flags\t\t: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 hypervisor

processor\t: 1
model name\t: another core's line is not read
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes asimdhp sve sve2 bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


def test_the_machine_names_its_cpu_instruction_sets_and_cores():
    x86 = machine.describe(X86)
    assert (x86["cpu"], x86["cpu_id"]) == ("AMD EPYC 9B14", "family 25 model 17 stepping 1")
    assert x86["isa"] == ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                          "avx512vl", "avx512_bf16"]
    assert x86["cores"] >= 1
    assert machine.line(x86) == (f"AMD EPYC 9B14 (family 25 model 17 stepping 1), avx2 + "
                                 f"avx512f, {x86['cores']} cores")
    arm = machine.describe(ARM)
    assert arm["cpu_id"] == "implementer 0x41 part 0xd4f"
    assert arm["isa"] == ["asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm"]
    assert ", asimd + sve + sve2, " in machine.line(arm)
    avx2_only = machine.describe(X86.replace(" avx512f avx512bw avx512vl avx512_bf16", ""))
    assert avx2_only["isa"] == ["sse4_2", "avx", "avx2", "fma", "f16c"]
    assert ", avx2, " in machine.line(avx2_only)
