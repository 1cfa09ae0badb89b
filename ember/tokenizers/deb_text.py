"""Text in many languages from Debian packages, for `ember tokenizers compare`, offline.

Firefox's language packs (`firefox-esr-l10n-ko`, `-hi-in`, `-en-gb`, ...) carry the same
messages in each language as Fluent (.ftl) files inside an .xpi inside the .deb: the messages
whose ids every given pack has form a parallel corpus, so each language says the same
things and the cost ratios compare like with like. Read from wherever `apt-get download`
put the packages; nothing is stored in the repository.
"""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from pathlib import Path

# The language packs of the cost comparison, by language ("english" is its baseline).
LANGUAGE_PACKS = {
    "english": "firefox-esr-l10n-en-gb",
    "korean": "firefox-esr-l10n-ko",
    "hindi": "firefox-esr-l10n-hi-in",
}
FLUENT_MESSAGE = re.compile(r"^(?P<id>[A-Za-z][\w-]*|\s+\.[\w-]+)\s*=\s*(?P<value>.*\S)?\s*$")
PLACEABLE = re.compile(r"\{[^{}]*\}")


def deb_members(deb_path: str | Path) -> dict[str, bytes]:
    """Files of a .deb's data archive, by path (an `ar` archive holding data.tar.*)."""
    blob = Path(deb_path).read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb_path} is not a Debian package (no ar header)")
    position = 8
    while position + 60 <= len(blob):
        header = blob[position : position + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = blob[position + 60 : position + 60 + size]
        position += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as archive:
                return {
                    member.name: archive.extractfile(member).read()
                    for member in archive.getmembers()
                    if member.isfile()
                }
    raise ValueError(f"{deb_path} has no data.tar member")


def fluent_messages(ftl: str, prefix: str = "") -> dict[str, str]:
    """Message id -> text of a Fluent file (attributes as id.attr), placeables removed."""
    messages: dict[str, str] = {}
    current = None
    for line in ftl.splitlines():
        match = FLUENT_MESSAGE.match(line)
        if match is None or line.lstrip().startswith("#"):
            continue
        key = match["id"].strip()
        if not key.startswith("."):
            current = key
        elif current is None:
            continue
        else:
            key = current + key
        text = PLACEABLE.sub("", match["value"] or "").strip()
        if text:
            messages[prefix + key] = text
    return messages


def firefox_l10n_messages(deb_path: str | Path) -> dict[str, str]:
    """Every message of a Firefox language pack .deb, keyed by file and id."""
    messages: dict[str, str] = {}
    for name, data in deb_members(deb_path).items():
        if not name.endswith(".xpi"):
            continue
        with zipfile.ZipFile(io.BytesIO(data)) as xpi:
            for entry in xpi.namelist():
                if entry.endswith(".ftl"):
                    text = xpi.read(entry).decode("utf-8", errors="replace")
                    locale_free = re.sub(r"^localization/[^/]+/", "", entry)
                    messages.update(fluent_messages(text, prefix=locale_free + ":"))
    if not messages:
        raise ValueError(
            f"{deb_path}: no Fluent messages found (is it a firefox-esr-l10n-* package?)"
        )
    return messages


def parallel_texts(debs: dict[str, str | Path]) -> dict[str, str]:
    """language -> its text of the messages every package has, one message per line, in
    the same order for every language."""
    by_language = {language: firefox_l10n_messages(path) for language, path in debs.items()}
    shared = set.intersection(*(set(messages) for messages in by_language.values()))
    keys = sorted(shared)
    return {
        language: "\n".join(messages[key] for key in keys)
        for language, messages in by_language.items()
    }


def find_language_packs(
    folder: str | Path, packages: dict[str, str] = LANGUAGE_PACKS
) -> dict[str, Path]:
    """language -> its package's .deb in `folder`, named as `apt-get download` names them
    (PACKAGE_VERSION_all.deb; the last in name order where there are several). Languages
    without one are left out."""
    found = {}
    for language, package in packages.items():
        debs = sorted(Path(folder).glob(f"{package}_*.deb"))
        if debs:
            found[language] = debs[-1]
    return found
