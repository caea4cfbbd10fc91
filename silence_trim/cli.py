"""`voicering trim ...`: measure and trim head/tail silence of audio files."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)

_DETECTOR_HELP = "energy (clean audio, no model) or vad (silero model, for noisy recordings)"


def _check_detector(detector: str) -> str:
    from silence_trim.report import DETECTORS

    if detector not in DETECTORS:
        raise typer.BadParameter(f"choose one of {', '.join(DETECTORS)}")
    return detector


@app.command("measure")
def measure_files(
    files: list[Path] = typer.Argument(..., help="Audio files (wav, flac, ...)."),
    detector: str = typer.Option("energy", "--detector", "-d", callback=_check_detector, help=_DETECTOR_HELP),
    downmix: bool = typer.Option(False, "--downmix", help="Measure multi-channel files on their mix."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON list, one object per file."),
) -> None:
    """Leading/trailing silence and speech length of each file."""
    from silence_trim.audio_io import read_audio
    from silence_trim.detect import measure
    from silence_trim.errors import SilenceTrimError
    from silence_trim.vad import SileroVad

    vad = SileroVad() if detector == "vad" else None
    rows, failed = [], 0
    for path in files:
        try:
            decoded = read_audio(path)
            report = measure(decoded.samples, decoded.sample_rate, detector, vad=vad, downmix=downmix)  # type: ignore[arg-type]
            rows.append({"file": str(path), **report.to_dict()})
        except SilenceTrimError as err:
            failed += 1
            rows.append({"file": str(path), "error": str(err)})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            if "error" in row:
                typer.echo(f"{row['file']}: error: {row['error']}", err=True)
            else:
                typer.echo(
                    f"{row['file']}: leading {row['leading_silence_ms']:.1f} ms, trailing "
                    f"{row['trailing_silence_ms']:.1f} ms, speech {row['speech_ms']:.1f} ms ({row['detector']})"
                    + ("" if row["has_speech"] else ", no speech")
                )
    if failed:
        raise typer.Exit(1)


@app.command("apply")
def apply(
    source: Path = typer.Argument(..., help="An audio file or a folder of them."),
    target: Path = typer.Argument(..., help="Output file, or output folder (same relative paths)."),
    detector: str = typer.Option("energy", "--detector", "-d", callback=_check_detector, help=_DETECTOR_HELP),
    margin_ms: float = typer.Option(20.0, help="Silence kept before speech (and after it)."),
    tail_margin_ms: float = typer.Option(None, help="Silence kept after speech (default: --margin-ms)."),
    fade_ms: float = typer.Option(5.0, help="Fade over the kept margin, no longer than it."),
    head: bool = typer.Option(True, "--head/--no-head", help="Trim leading silence."),
    tail: bool = typer.Option(True, "--tail/--no-tail", help="Trim trailing silence."),
    downmix: bool = typer.Option(False, "--downmix", help="Detect on the mix of multi-channel files."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary and every file as JSON."),
) -> None:
    """Trim leading/trailing silence from a file or a folder, never inside speech; print a summary."""
    from silence_trim.errors import SilenceTrimError
    from silence_trim.trim import FileTrim, TrimOptions, summarize, trim_file, trim_folder

    try:
        options = TrimOptions(
            detector=detector,  # type: ignore[arg-type]
            margin_ms=margin_ms, tail_margin_ms=tail_margin_ms, fade_ms=fade_ms,
            head=head, tail=tail, downmix=downmix,
        )
        if source.is_dir():
            outcomes = trim_folder(source, target, options)
        else:
            try:
                outcomes = [trim_file(source, target, options)]
            except SilenceTrimError as err:
                outcomes = [FileTrim(source, None, None, error=str(err))]
    except SilenceTrimError as err:
        raise typer.BadParameter(str(err)) from err
    summary = summarize(outcomes)
    if as_json:
        typer.echo(json.dumps({"summary": summary, "files": [o.to_dict() for o in outcomes]}, indent=2))
    else:
        for o in outcomes:
            if o.error:
                typer.echo(f"{o.source}: error: {o.error}", err=True)
            else:
                note = "" if o.report.has_speech else " (no speech: copied unchanged)"
                typer.echo(f"{o.source} -> {o.target}: -{o.removed_head_ms:.1f} ms head, -{o.removed_tail_ms:.1f} ms tail{note}")
        typer.echo(
            f"{summary['trimmed']}/{summary['files']} files trimmed, {summary['failed']} failed, "
            f"{summary['no_speech']} without speech; removed {summary['removed_head_ms_total'] / 1000:.2f} s head, "
            f"{summary['removed_tail_ms_total'] / 1000:.2f} s tail"
        )
    if summary["failed"]:
        raise typer.Exit(1)

