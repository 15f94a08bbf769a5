"""The pages' Jinja2 environment: relay/web/templates in front of the templates relay report
shares with them (relay/operator/templating.py: autoescape on, every value printed made inert,
the filters)."""
import jinja2

from relay.operator.templating import age, css_word, hour_bars, inert, sheds, thread_href, utc  # noqa: F401
from relay.operator.templating import environment as shared

TEMPLATES = jinja2.PackageLoader("relay.web", "templates")


def environment():
    return shared(TEMPLATES)
