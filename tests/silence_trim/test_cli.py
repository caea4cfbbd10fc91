"""`voicering trim measure|apply` on real files; the silence bench is wired from above."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import soundfile as sf
from typer.testing import CliRunner

from silence_trim.cli import app
from tests.fixtures.speech import pad_silence

SR = 24000
runner = CliRunner()


def write(path, clip, head_ms, tail_ms=0.0):
    sf.write(path, pad_silence(clip, SR, head_ms, tail_ms), SR, subtype="PCM_16")
    return path


def test_measure_json_per_file(tmp_path, clip, vad):
    a = write(tmp_path / "a.wav", clip, 600, 200)
    b = write(tmp_path / "b.flac", clip, 100)
    for detector in ("energy", "vad"):
        result = runner.invoke(app, ["measure", str(a), str(b), "--json", "--detector", detector])
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output)
        assert [r["file"] for r in rows] == [str(a), str(b)]
        assert rows[0]["detector"] == detector
        assert abs(rows[0]["leading_silence_ms"] - 612) < 20 and abs(rows[1]["leading_silence_ms"] - 112) < 20
        assert {"trailing_silence_ms", "speech_ms"} <= set(rows[0])


def test_measure_text_and_a_corrupt_file(tmp_path, clip):
    good = write(tmp_path / "good.wav", clip, 600)
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....WAVE")
    result = runner.invoke(app, ["measure", str(good), str(bad)])
    assert result.exit_code == 1
    assert "good.wav: leading 61" in result.output and "(energy)" in result.output
    assert "bad.wav: error: cannot read" in result.output


def test_apply_file_and_folder_with_summary(tmp_path, clip):
    source = tmp_path / "in"
    source.mkdir()
    write(source / "one.wav", clip, 600, 600)
    write(source / "two.wav", clip, 1500)
    result = runner.invoke(app, ["apply", str(source / "one.wav"), str(tmp_path / "one.wav")])
    assert result.exit_code == 0, result.output
    assert "1/1 files trimmed, 0 failed" in result.output
    assert sf.info(tmp_path / "one.wav").duration < sf.info(source / "one.wav").duration - 1.0

    result = runner.invoke(app, ["apply", str(source), str(tmp_path / "out"), "--json", "--margin-ms", "30", "--no-tail"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["summary"]["trimmed"] == 2 and report["summary"]["failed"] == 0
    removed = sorted(f["removed_head_ms"] for f in report["files"])
    assert abs(removed[0] - (612 - 30)) < 10 and abs(removed[1] - (1512 - 30)) < 10
    assert all(f["removed_tail_ms"] == 0 for f in report["files"])


def test_bad_options_are_reported(tmp_path, clip):
    path = write(tmp_path / "a.wav", clip, 100)
    result = runner.invoke(app, ["apply", str(path), str(tmp_path / "b.wav"), "--margin-ms", "2"])
    assert result.exit_code != 0 and "fade_ms" in result.output
    result = runner.invoke(app, ["measure", str(path), "--detector", "webrtc"])
    assert result.exit_code != 0 and "choose one of energy, vad" in result.output


def test_silence_trim_never_imports_bench():
    # Regression: `voicering trim bench` imported bench.silence lazily from silence_trim/cli.py;
    # the command is now `voicering bench silence`, registered by bench/cli.py.
    found = []
    for path in sorted((Path(__file__).parents[2] / "silence_trim").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [f"{path.name}: {a.name}" for a in node.names if a.name.split(".")[0] == "bench"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bench" and not node.level:
                found.append(f"{path.name}: {node.module}")
    assert not found, found
    assert "bench" not in {c.name for c in app.registered_commands}


def test_bench_silence_is_a_root_command(monkeypatch):
    import bench.silence
    from voicering.cli import app as root

    monkeypatch.setattr(bench.silence, "run", lambda seconds: {"seconds": seconds})
    result = runner.invoke(root, ["bench", "silence", "--json", "--seconds", "3"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"seconds": 3.0}
