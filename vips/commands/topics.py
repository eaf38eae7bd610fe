"""`vips topics`: each topic of an LDA posterior with its most probable words, one line per topic."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service.ui.posterior_summary import repeated_topics_note, top_words
from vips.errors import UsageError
from vips.posterior import lda_parameters, load_posterior


def run(args: argparse.Namespace) -> int:
    document = load_posterior(Path(args.posterior))
    if document["model"] != "lda":
        raise UsageError(f"{args.posterior} is a {document['model']} posterior; topics are LDA's")
    lda_parameters(document)  # checks lambda's shape and values
    if not isinstance(document.get("topics"), list):
        raise UsageError(f"{args.posterior} has no list of topics (an LDA posterior of this service has one)")
    topics = top_words(document, args.words)
    order = sorted(topics, key=lambda t: -t.share) if args.by_share else topics
    for topic in order:
        sys.stdout.write(f"topic {topic.topic:>3} ({100 * topic.share:4.1f}%): {' '.join(topic.words)}\n")
    sys.stdout.flush()
    note = repeated_topics_note(document)
    if note is not None:
        print(f"vips: note: {note}", file=sys.stderr)
    return 0
