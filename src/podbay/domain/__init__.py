"""podbay.domain"""
