"""The sync endpoints' JSON parser: a full push of a big cluster is tens of megabytes. orjson-based, like
every JSON body now (draservice.parsers); the name stays for the views that import it."""
from draservice.parsers import JSONParser as FastJSONParser

__all__ = ["FastJSONParser"]
