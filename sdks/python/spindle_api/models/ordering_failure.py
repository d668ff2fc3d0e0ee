from enum import StrEnum

class OrderingFailure(StrEnum):
    BLOCK = "block"
    RELEASE = "release"

    def __str__(self) -> str:
        return str(self.value)
