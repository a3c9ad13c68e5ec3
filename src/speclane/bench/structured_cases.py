"""JSON schemas with a prompt each: the structured-output tests and benchmarks use them.

The set covers what agent traffic sends: nested objects, arrays, enums, integers and
numbers with bounds, strings with escapes, optional fields, ``anyOf`` and ``$ref``. Each
case has a valid ``example`` so a benchmark can teacher-force the same text through a
matcher. ``FIXED_KEY_CASES`` are the schema-shaped answers with several fixed keys that
forced-token drafting is measured on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SchemaCase:
    name: str
    schema: dict[str, Any]
    prompt: str
    example: Any


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False}


CASES: tuple[SchemaCase, ...] = (
    SchemaCase("city", _obj({"name": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40},
                             "population": {"type": "integer", "minimum": 0, "maximum": 100000000}}),
               "Describe Paris as JSON with its name, country and population.",
               {"name": "Paris", "country": "France", "population": 2100000}),
    SchemaCase("person-nested", _obj({"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "address": _obj({"street": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 40},
                                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})}),
               "Invent a person and give their name, age and address as JSON.",
               {"name": "Ann Lee", "age": 34, "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}}),
    SchemaCase("shopping-list", _obj({"items": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                                "minItems": 2, "maxItems": 5}}),
               "Write a short shopping list for a pancake breakfast as JSON.",
               {"items": ["flour", "eggs", "milk"]}),
    SchemaCase("sentiment-enum", _obj({"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                       "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
               "Classify the sentiment of: 'I loved the film, the music was great.' Answer as JSON.",
               {"sentiment": "positive", "confidence": 0.9}),
    SchemaCase("weather", _obj({"location": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                "temperature": {"type": "number", "minimum": -90, "maximum": 60}, "conditions": {"type": "string", "maxLength": 40}}),
               "Report today's weather in Oslo as JSON.",
               {"location": "Oslo", "unit": "celsius", "temperature": -3.5, "conditions": "snow"}),
    SchemaCase("escaped-quote", _obj({"quote": {"type": "string", "maxLength": 40}, "author": {"type": "string", "maxLength": 40}}),
               'Give a famous quote that contains the word "time", with its author, as JSON.',
               {"quote": "Time is \"money\",\n said he\\she", "author": "Benjamin Franklin"}),
    SchemaCase("order-items", _obj({"order_id": {"type": "integer", "minimum": 1, "maximum": 99999}, "items": {
                   "type": "array", "minItems": 1, "maxItems": 3,
                   "items": _obj({"sku": {"type": "string", "maxLength": 40}, "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                  "price": {"type": "number", "minimum": 0, "maximum": 10000}})}, "paid": {"type": "boolean"}}),
               "Make up an online order with one or two items as JSON.",
               {"order_id": 1042, "items": [{"sku": "A-1", "quantity": 2, "price": 9.99}], "paid": True}),
    SchemaCase("optional-fields", _obj({"title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1880, "maximum": 2030},
                                        "director": {"type": "string", "maxLength": 40}, "rating": {"type": "number", "minimum": 0, "maximum": 10}},
                                       required=["title", "year"]),
               "Name a classic film and its year as JSON.",
               {"title": "Casablanca", "year": 1942}),
    SchemaCase("any-of", _obj({"result": {"anyOf": [{"type": "integer", "minimum": -1000, "maximum": 1000}, {"type": "string", "maxLength": 20}]},
                               "ok": {"type": "boolean"}}),
               "What is 6 times 7? Answer as JSON with the result and whether you are sure.",
               {"result": 42, "ok": True}),
    SchemaCase("ref-defs", {"$defs": {"point": _obj({"x": {"type": "integer", "minimum": -100, "maximum": 100}, "y": {"type": "integer", "minimum": -100, "maximum": 100}})},
                            **_obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}})},
               "Give a line segment from the origin to (3, 4) as JSON.",
               {"start": {"x": 0, "y": 0}, "end": {"x": 3, "y": 4}}),
    SchemaCase("tags-enum-array", _obj({"title": {"type": "string", "maxLength": 60}, "tags": {
                   "type": "array", "items": {"enum": ["news", "sport", "tech", "health", "art"]},
                   "minItems": 1, "maxItems": 3}}),
               "Tag this headline as JSON: 'New running shoes use recycled carbon plates.'",
               {"title": "New running shoes", "tags": ["sport", "tech"]}),
    SchemaCase("matrix", _obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
                   "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}}),
               "Write the 2 by 2 identity matrix as JSON.",
               {"rows": [[1, 0], [0, 1]]}),
    SchemaCase("event", _obj({"event": {"type": "string", "maxLength": 40}, "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                              "attendees": {"type": "integer", "minimum": 1, "maximum": 1000},
                              "online": {"type": "boolean"}}),
               "Plan a small birthday party and describe it as JSON.",
               {"event": "Birthday party", "date": "2026-05-01", "attendees": 12, "online": False}),
    SchemaCase("unicode-text", _obj({"language": {"type": "string", "maxLength": 40}, "greeting": {"type": "string", "maxLength": 40}}),
               "How do you say hello in Japanese? Answer as JSON.",
               {"language": "Japanese", "greeting": "こんにちは"}),
)

# Objects with several fixed keys and short values: most of the answer is forced.
FIXED_KEY_CASES: tuple[SchemaCase, ...] = (
    SchemaCase("profile-form", _obj({
        "first_name": {"type": "string", "maxLength": 12}, "last_name": {"type": "string", "maxLength": 12},
        "email_address": {"type": "string", "maxLength": 24}, "phone_number": {"type": "string", "maxLength": 14},
        "date_of_birth": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        "preferred_language": {"enum": ["english", "french", "german", "spanish"]},
        "newsletter_subscription": {"type": "boolean"}, "account_verified": {"type": "boolean"}}),
        "Fill in a user profile form for a made-up person as JSON.",
        {"first_name": "Ann", "last_name": "Lee", "email_address": "ann@example.com", "phone_number": "555-0100",
         "date_of_birth": "1990-01-02", "preferred_language": "english", "newsletter_subscription": True,
         "account_verified": False}),
    SchemaCase("server-config", _obj({
        "service_name": {"type": "string", "maxLength": 16}, "listen_port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "enable_tls_encryption": {"type": "boolean"}, "maximum_connections": {"type": "integer", "minimum": 1, "maximum": 9999},
        "request_timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 600},
        "log_level": {"enum": ["debug", "info", "warning", "error"]},
        "health_check_enabled": {"type": "boolean"}}),
        "Write the configuration of a small web service as JSON.",
        {"service_name": "web", "listen_port": 8080, "enable_tls_encryption": True, "maximum_connections": 100,
         "request_timeout_seconds": 30, "log_level": "info", "health_check_enabled": True}),
    SchemaCase("book-record", _obj({
        "book_title": {"type": "string", "maxLength": 30}, "author_full_name": {"type": "string", "maxLength": 24},
        "publication_year": {"type": "integer", "minimum": 1450, "maximum": 2030},
        "number_of_pages": {"type": "integer", "minimum": 1, "maximum": 5000},
        "literary_genre": {"enum": ["fiction", "mystery", "science", "history", "poetry"]},
        "currently_in_stock": {"type": "boolean"}}),
        "Catalogue a well-known novel as a JSON library record.",
        {"book_title": "Emma", "author_full_name": "Jane Austen", "publication_year": 1815, "number_of_pages": 474,
         "literary_genre": "fiction", "currently_in_stock": True}),
    SchemaCase("sensor-reading", _obj({
        "sensor_identifier": {"type": "string", "maxLength": 10},
        "measurement_type": {"enum": ["temperature", "humidity", "pressure"]},
        "measurement_value": {"type": "integer", "minimum": -100, "maximum": 2000},
        "measurement_unit": {"enum": ["celsius", "percent", "hectopascal"]},
        "battery_level_percent": {"type": "integer", "minimum": 0, "maximum": 100},
        "calibration_required": {"type": "boolean"}}),
        "Report one reading from a weather station sensor as JSON.",
        {"sensor_identifier": "ws-7", "measurement_type": "humidity", "measurement_value": 64,
         "measurement_unit": "percent", "battery_level_percent": 88, "calibration_required": False}),
)
